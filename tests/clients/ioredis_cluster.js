// Runs commands through ioredis's Redis.Cluster against a fleet with shard's cluster protocol
// (argv[2] "cluster"; "replicas": with scaleReads "slave", reads go to the replicas), or through
// a plain ioredis client against one server ("single", the reference). argv[3]: host:port. stdin: a JSON array of commands ([name, ...args]).
// stdout: a JSON array of results, each {"ok": value} or {"err": message}; values are strings,
// integers, null or arrays of those.
//
// argv[2] "load": a load through Redis.Cluster until stdin closes. stdin's first line: a JSON
// array of keys, each holding "v-<key>"; the load INCRs "<key>:n" or GETs the key at random.
// stdout: {"counts": {key: last INCR reply}, "errors": [...], "wrong": [keys read wrong]}.
"use strict";
const Redis = require("ioredis");

async function load(host, port) {
  const cluster = new Redis.Cluster([{ host, port: Number(port) }], {
    redisOptions: { connectTimeout: 5000 },
    maxRedirections: 16,
    slotsRefreshTimeout: 5000,
  });
  let input = "";
  let keys = null;
  let stopped = false;
  process.stdin.setEncoding("utf8");
  process.stdin.on("data", (chunk) => { input += chunk; });
  process.stdin.on("end", () => { stopped = true; });
  while (keys === null) {
    const nl = input.indexOf("\n");
    if (nl >= 0) keys = JSON.parse(input.slice(0, nl));
    else await new Promise((r) => setTimeout(r, 10));
  }
  const counts = {};
  const errors = [];
  const wrong = [];
  let ops = 0;
  while (!stopped) {
    const k = keys[Math.floor(Math.random() * keys.length)];
    try {
      if (Math.random() < 0.5) counts[k] = await cluster.incr(`${k}:n`);
      else if ((await cluster.get(k)) !== `v-${k}`) wrong.push(k);
    } catch (e) {
      errors.push(`${k}: ${e.message}`);
    }
    ops += 1;
  }
  await cluster.quit();
  process.stdout.write(JSON.stringify({ counts, errors, wrong, ops }));
}

async function main() {
  const mode = process.argv[2];
  const [host, port] = process.argv[3].split(":");
  if (mode === "load") return load(host, port);
  const input = require("fs").readFileSync(0, "utf8");
  const commands = JSON.parse(input);
  const cluster = mode === "cluster" || mode === "replicas"
    ? new Redis.Cluster([{ host, port: Number(port) }], {
        redisOptions: { connectTimeout: 5000 },
        maxRedirections: 16,
        slotsRefreshTimeout: 5000,
        scaleReads: mode === "replicas" ? "slave" : "master",
      })
    : new Redis({ host, port: Number(port), connectTimeout: 5000 });
  const out = [];
  for (const [name, ...args] of commands) {
    try {
      // Lower case: ioredis finds a command's keys and its readonly flag by that name.
      out.push({ ok: await cluster.call(name.toLowerCase(), ...args) });
    } catch (e) {
      out.push({ err: String(e.message) });
    }
  }
  await cluster.quit();
  process.stdout.write(JSON.stringify(out));
}

main().catch((e) => {
  process.stderr.write(String(e && e.stack ? e.stack : e));
  process.exit(1);
});

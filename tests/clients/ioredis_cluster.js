// Runs commands through ioredis's Redis.Cluster against a fleet with shard's cluster protocol
// (argv[2] "cluster"), or through a plain ioredis client against one server ("single", the
// reference). argv[3]: host:port. stdin: a JSON array of commands ([name, ...args]).
// stdout: a JSON array of results, each {"ok": value} or {"err": message}; values are strings,
// integers, null or arrays of those.
"use strict";
const Redis = require("ioredis");

async function main() {
  const mode = process.argv[2];
  const [host, port] = process.argv[3].split(":");
  const input = require("fs").readFileSync(0, "utf8");
  const commands = JSON.parse(input);
  const cluster = mode === "cluster"
    ? new Redis.Cluster([{ host, port: Number(port) }], {
        redisOptions: { connectTimeout: 5000 },
        maxRedirections: 16,
        slotsRefreshTimeout: 5000,
      })
    : new Redis({ host, port: Number(port), connectTimeout: 5000 });
  const out = [];
  for (const [name, ...args] of commands) {
    try {
      out.push({ ok: await cluster.call(name, ...args) });
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

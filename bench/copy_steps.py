#!/usr/bin/env python3
"""A copy pass in steps against a forked one (issue 44's "No stall"): one COPY of 766 000 of
1 000 000 small keys (`DEBUG POPULATE`, ring a:1 -> a:1 b:3, the key index on and ready), with
`shard.copy-fork yes` (a forked child walks the index and ships) and `auto` (the main thread
takes the index's names in 1 ms steps, serializes them, and a thread ships), interleaved round
by round on fresh servers. Per run: wall time and keys/s; CPU the source's main thread spent
(/proc/<pid>/task/<pid>/stat) and the whole process's with its reaped children (the fork's
child); the source's worst `shard-copy-step-cpu` (LATENCY, threshold 1 ms), `max_step_us`, its
forks; PING p99 and worst (a PING every ms).

Writes the section "Copy in steps" into bench/results.md (`--no-write`: print only). Standard
library only.
"""

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run as base  # noqa: E402

cp = base.bench_copy()

RESULTS = base.ROOT / "bench" / "results.md"
SECTION = "## Copy in steps against a forked copy (issue 44)"
TICK = os.sysconf("SC_CLK_TCK")


def cpu(pid):
    """(main thread's CPU s, process's CPU s with its reaped children)."""
    main = Path(f"/proc/{pid}/task/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    proc = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return ((int(main[11]) + int(main[12])) / TICK,
            sum(int(x) for x in proc[11:15]) / TICK)


def one(keys, mode):
    cp.KEY_INDEX = "yes"
    a, b = cp.start(base.REDIS_SERVER, name="a"), cp.start(base.REDIS_SERVER, name="b")
    try:
        ca, cb = cp.client(a), cp.client(b)
        ca.call("CONFIG", "SET", "shard.copy-fork", mode)
        ca.call("DEBUG", "POPULATE", keys, "key", 42)
        for c in (ca, cb):
            c.call("SHARD.RING", "SET", "ketama", "a", f"127.0.0.1:{a.port}", 1)
        deadline = time.monotonic() + 300
        while b"key_index:ready" not in ca.call("INFO", "shard").replace(b"shard_", b""):
            if time.monotonic() > deadline:
                sys.exit("the key index did not get ready")
            time.sleep(0.05)
        for c in (ca, cb):
            c.call("SHARD.RING", "BEGIN", "ketama", "a", f"127.0.0.1:{a.port}", 1,
                   "b", f"127.0.0.1:{b.port}", 3)
        ca.call("CONFIG", "SET", "latency-monitor-threshold", 1)
        ca.call("LATENCY", "RESET")
        forks = int(dict(l.split(":", 1) for l in ca.call("INFO", "stats").decode().split()
                         if ":" in l)["total_forks"])
        pid = a.proc.pid
        m0, p0 = cpu(pid)
        pinger = cp.Pinger(a.port)
        pinger.start()
        t0 = time.perf_counter()
        ca.call("SHARD.RESHARD", "COPY")
        st = cp.wait_status(ca, (b"copying",))
        wall = time.perf_counter() - t0
        p99, pmax = pinger.finish()
        m1, p1 = cpu(pid)
        if st[b"state"] != b"done" or st[b"copied"] != cb.call("DBSIZE"):
            sys.exit(f"copy failed: {st}")
        step_cpu = max((int(r[3]) for r in ca.call("LATENCY", "LATEST") or []
                        if r[0] == b"shard-copy-step-cpu"), default=0)
        forks = int(dict(l.split(":", 1) for l in ca.call("INFO", "stats").decode().split()
                         if ":" in l)["total_forks"]) - forks
        return dict(copied=st[b"copied"], wall=wall, rate=st[b"copied"] / wall, main_cpu=m1 - m0,
                    proc_cpu=p1 - p0, step_cpu_ms=step_cpu, max_step_us=st[b"max_step_us"],
                    forks=forks, forked=st[b"passes_forked"], stepped=st[b"passes_stepped"],
                    p99=p99, pmax=pmax)
    finally:
        for p in (a, b):
            p.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-write", action="store_true")
    opts = ap.parse_args()
    base.TMP.mkdir(parents=True, exist_ok=True)
    runs = {"yes": [], "auto": []}
    for r in range(opts.rounds):
        for mode in (("yes", "auto") if r % 2 == 0 else ("auto", "yes")):
            d = one(opts.keys, mode)
            runs[mode].append(d)
            print(f"round {r + 1} copy-fork {mode}: " + ", ".join(
                f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}" for k, v in d.items()),
                flush=True)
    med = statistics.median
    lines = [SECTION, "",
             f"`python3 bench/copy_steps.py --keys {opts.keys} --rounds {opts.rounds}` on "
             f"{base.first_line([base.REDIS_SERVER, '--version'])}: a COPY of the keys that move "
             "to b (ring a:1 -> a:1 b:3), the key index ready, `shard.copy-fork yes` (forked) and "
             "`auto` (in steps) interleaved; medians of the rounds (load average "
             f"{os.getloadavg()[0]:.1f} at the end, 2 cores).", "",
             "| copy-fork | keys copied | wall s | keys/s | source main-thread CPU s | source "
             "process CPU s (with the child) | worst step CPU ms | max_step_us | forks | passes "
             "forked / in steps | PING p99 ms | PING worst ms |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for mode, ds in runs.items():
        m = lambda k: med(d[k] for d in ds)  # noqa: E731
        lines.append(f"| {mode} | {int(m('copied')):,} | {m('wall'):.2f} | {m('rate'):,.0f} | "
                     f"{m('main_cpu'):.2f} | {m('proc_cpu'):.2f} | {m('step_cpu_ms'):.0f} | "
                     f"{int(m('max_step_us')):,} | {m('forks'):.0f} | {m('forked'):.0f} / "
                     f"{m('stepped'):.0f} | {m('p99'):.2f} | {m('pmax'):.2f} |")
    ratio = med(d["rate"] for d in runs["auto"]) / med(d["rate"] for d in runs["yes"])
    lines += ["", f"Keys/s in steps over keys/s forked: {ratio:.2f}. Per round:", ""]
    for mode, ds in runs.items():
        for i, d in enumerate(ds):
            lines.append(f"- {mode} round {i + 1}: {d['rate']:,.0f} keys/s, main thread "
                         f"{d['main_cpu']:.2f} s CPU, worst step {d['step_cpu_ms']} ms CPU, "
                         f"PING worst {d['pmax']:.1f} ms")
    print("\n".join(lines))
    if not opts.no_write:
        text = RESULTS.read_text() if RESULTS.exists() else ""
        body = "\n".join(lines) + "\n"
        if SECTION in text:
            head, rest = text.split(SECTION, 1)
            nxt = rest.find("\n## ")
            text = head + body + (rest[nxt + 1:] if nxt >= 0 else "")
        else:
            text = text.rstrip("\n") + "\n\n" + body
        RESULTS.write_text(text)


if __name__ == "__main__":
    main()

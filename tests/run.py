"""Runs the integration tests on one or more servers, side by side, as `make integration` does.

    python tests/run.py [--workers N] SERVER [SERVER ...]

Three passes:

1. the tests that can share the machine, on every server at once, each server's suite with N
   pytest-xdist workers (`-n N`): they mostly wait (servers starting, failovers, copies), and
   each test process listens on ports of its own (tests/helpers/ports.py);
2. the resharding, fleet, chaos and cluster-client tests again with the key index on in every
   server (`SHARD_KEY_INDEX=yes`, tests/helpers/server.py), on every server at once, the same
   way (`--no-index` leaves this pass out);
3. the tests marked `serial` (they measure a time, a rate or a latency, which other tests
   running beside them would distort), one server after the other, one test at a time.

Each pytest run's output is shown as it comes, each line led by the server's name, and kept in
tests/.tmp/<server>-<pass>.log; the servers' own directories and logs stay under
tests/.tmp/<server>-<pass>/ until the next run. At the end: each run's outcome, the ten slowest
tests of all runs, and the servers whose suite failed (the exit status is then 1).

The test files also run with plain pytest, one test after another (`pytest tests`) or side by
side (`pytest -n 4 tests`); the `serial` tests then share the machine with the others.

Arguments after `--` go to every pytest run (`python tests/run.py redis-server -- -k ring`).
"""

import argparse
import os
import re
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / ".tmp"
# The `partitions` tests are `make partitions`' (tests/test_partition*.py): make test keeps a
# few, and the short nemesis schedule's cut of each kind.
PASSES = {"parallel": ["-m", "not serial and not partitions"],
          "serial": ["-m", "serial and not partitions"]}
# The files run again with the key index on (issue 32: every resharding, fleet, chaos and
# cluster-client test passes with the index on and with it off).
INDEX_FILES = ["tests/test_copy_pipeline.py", "tests/test_reshard.py", "tests/test_fleet.py",
               "tests/test_chaos.py", "tests/test_cluster_protocol.py", "tests/test_one_walk.py",
               "tests/test_slot_map.py", "tests/test_commit_window.py"]
# One test at a time to whichever worker is free, in collection order (the `slow` ones first,
# tests/conftest.py): xdist's default hands each worker a run of consecutive tests at first,
# which put every slow test on the same worker.
DIST = ["--dist", "load", "--maxschedchunk", "1"]


class Run:
    """One pytest process: a server and a pass, its output led by the server's label."""

    def __init__(self, server, label, name, args, env=None):
        self.server, self.label, self.name = server, label, name
        self.extra_env = env or {}
        self.log = OUT / f"{label}-{name}.log"
        self.junit = OUT / f"{label}-{name}.xml"
        # The servers' directories and logs of the run's tests stay there until the next run.
        self.cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
                    f"--junitxml={self.junit}", f"--basetemp={OUT / f'{label}-{name}'}", *args]
        self.summary = ""
        self.code = None

    def start(self):
        self.started = time.monotonic()
        env = dict(os.environ, REDIS_SERVER=self.server, PYTHONUNBUFFERED="1", **self.extra_env)
        self.proc = subprocess.Popen(self.cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, errors="replace")
        self.thread = threading.Thread(target=self._copy, daemon=True)
        self.thread.start()
        return self

    def _copy(self):
        with open(self.log, "w") as log:
            for line in self.proc.stdout:
                log.write(line)
                log.flush()
                print(f"[{self.label} {self.name}] {line}", end="", flush=True)
                if " passed" in line or " failed" in line or " error" in line \
                        or "no tests ran" in line:
                    self.summary = line.strip(" =\n")

    def wait(self):
        self.code = self.proc.wait()
        self.thread.join()
        self.seconds = time.monotonic() - self.started
        # 5: no test was selected (a pass with no test on this server), not a failure.
        return self.code in (0, 5)

    def cases(self):
        """The test cases of the run's JUnit XML (none if it was not written)."""
        try:
            return list(ET.parse(self.junit).iter("testcase"))
        except (OSError, ET.ParseError):
            return []

    def failures(self):
        """(test id [server], first line of the failure) of every failed or erroring test."""
        out = []
        for case in self.cases():
            for bad in list(case.iter("failure")) + list(case.iter("error")):
                why = (bad.get("message") or bad.text or "").strip().splitlines()
                out.append((f"{node_id(case)} [{self.label}]", why[0][:300] if why else "?"))
        return out

    def failed_ids(self):
        """The pytest node ids of the failed tests."""
        return sorted({node_id(case) for case in self.cases()
                       if case.find("failure") is not None or case.find("error") is not None})

    def durations(self):
        """(seconds, test id) of every test of the run, from its JUnit XML (setup, call and
        teardown together)."""
        return [(float(case.get("time", 0)), f"{node_id(case)} [{self.label}]")
                for case in self.cases()]


def node_id(case):
    """A JUnit test case's pytest node id (tests/test_x.py::test_y[param])."""
    return case.get("classname", "").replace(".", "/") + ".py::" + case.get("name", "")


def label_of(server):
    """redis-server, valkey-server, ...: the binary's name (made unique by the caller)."""
    return Path(server).name


def main():
    argv = sys.argv[1:]
    extra = []
    if "--" in argv:
        extra = argv[argv.index("--") + 1:]
        argv = argv[:argv.index("--")]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=4,
                        help="pytest-xdist workers per server in the first pass (default 4)")
    parser.add_argument("--no-index", action="store_true",
                        help="leave out the pass with the key index on")
    parser.add_argument("servers", nargs="+", help="server binaries (redis-server, ...)")
    args = parser.parse_args(argv)
    OUT.mkdir(parents=True, exist_ok=True)
    labels = {}
    for s in args.servers:
        label = label_of(s)
        labels[s] = label if label not in labels.values() else f"{label}-{len(labels)}"

    started = time.monotonic()
    runs = []

    def side_by_side(name, selection, env=None):
        """One pass per server, all at once; its runs when they all ended."""
        group = [Run(s, labels[s], name,
                     [*PASSES["parallel"], "-n", str(args.workers), *DIST, *selection], env=env)
                 for s in args.servers]
        for run in group:
            run.start()
        for run in group:
            run.wait()
        return group

    parallel = side_by_side("parallel", extra)
    runs += parallel
    # Files named after `--` replace the whole selection: then no pass of the index files.
    if not args.no_index and not any(a.endswith(".py") or "::" in a for a in extra):
        indexed = side_by_side("index", [*extra, *INDEX_FILES], env={"SHARD_KEY_INDEX": "yes"})
        runs += indexed
        parallel += indexed
    for s in args.servers:
        run = Run(s, labels[s], "serial", [*PASSES["serial"], *extra]).start()
        run.wait()
        runs.append(run)
    # A test that failed beside the others runs again alone: if it passes then, the suite
    # passes, and the summary names it (a test that depends on the machine's load, to fix).
    retried = []
    for run in parallel:
        ids = run.failed_ids()
        if run.code not in (0, 5) and ids and len(ids) <= 5:
            again = Run(run.server, run.label, f"again-{run.name}", ids,
                        env=run.extra_env).start()
            again.wait()
            retried.append((run, again))
            runs.append(again)
    elapsed = time.monotonic() - started

    print(f"\n==== integration tests: {len(args.servers)} server(s) in {elapsed:.0f} s")
    for run in runs:
        print(f"  {run.label:<16} {run.name:<9} {run.seconds:6.0f} s  {run.summary or '?'}"
              f"  (log: {run.log.relative_to(ROOT)})")
    slowest = sorted((d for run in runs for d in run.durations()), reverse=True)[:10]
    print("==== the ten slowest tests (setup, call and teardown)")
    for seconds, test in slowest:
        print(f"  {seconds:7.2f}s  {test}")
    failures = [f for run in runs if not run.name.startswith("again") for f in run.failures()]
    if failures:
        # CI shows only the end of the output: say here which tests failed and why.
        print("==== the failed tests")
        for test, why in failures:
            print(f"  {test}\n      {why}")
    totals = {word: 0 for word in ("passed", "failed", "skipped", "error")}
    for run in runs:
        if run.name.startswith("again"):
            continue
        for count, word in re.findall(r"(\d+) (passed|failed|skipped|errors?)\b", run.summary or ""):
            totals[word.rstrip("s") if word.startswith("error") else word] += int(count)
    flaky = 0
    for run, again in retried:
        if again.code == 0:
            flaky += len(run.failed_ids())
            totals["passed"] += len(run.failed_ids())
            print(f"==== failed beside the other tests and passed alone on {run.label} "
                  "(they depend on the machine's load: to fix)")
            for test in run.failed_ids():
                print(f"  {test}")
            run.code = 0
    failed = sorted({run.server for run in runs if run.code not in (0, 5)})
    # One plain line for whoever reads the end of the output (CI): every run counted.
    # (A test that failed and then passed alone counts once, as passed, and as flaky.)
    print(f"integration: {totals['passed']} passed, {totals['failed'] + totals['error'] - flaky} "
          f"failed, {totals['skipped']} skipped" + (f", {flaky} flaky" if flaky else ""))
    if failed:
        print(f"integration tests failed on: {' '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""redis-py's own test suite, unchanged, against one plain server and against one node of a
three-node fleet with `shard.route-plain yes` (issue 43: "a real client's own test suite passes
on the fleet"); docs/one-server.md, "redis-py's own test suite".

    python tests/redispy_suite.py [--server BINARY] [-k EXPR] [--workers N] [--files F ...]
                                  [--ring ketama|slots] [--hashtag RULE]
                                  [--compare-only] [-v] [-- PYTEST ARGS]

1. redis-py's source release (sdist) of the version tests/requirements.txt pins is downloaded
   once (`pip download --no-binary :all: --no-deps`) and unpacked under tests/.cache/ (never
   committed); its `tests/` run as released.
2. A plain server (no module) and a fleet (three servers with the module, `self nX route-plain
   yes`, a ketama ring of the three set on each, then `SHARD.RING PUSH`) start on free loopback
   ports (tests/helpers); with `--workers N`, N of each, one per pytest-xdist worker.
3. The standalone tests (`-m "not onlycluster and not redismod and not ssl and not graph"`; the
   asyncio tests and test_search.py need packages the venv does not have) run against the plain
   server, then against node n0 of the fleet, each with its JUnit XML in tests/.tmp/redispy/.
4. Compared: a test that passes on the plain server and does not pass on the fleet is a
   regression unless tests/redispy_expected.txt names it (`test id  # reason`); the exit status
   is 1 when there is one. Entries of that list that pass on the fleet are reported as stale.

The servers are stopped however the run ends.
"""

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
CACHE = TESTS / ".cache"
OUT = TESTS / ".tmp" / "redispy"
EXPECTED = TESTS / "redispy_expected.txt"
MARKERS = "not onlycluster and not redismod and not ssl and not graph"
# Files of redis-py's tests/ left out: they import packages the test venv does not have
# (pytest-asyncio, numpy) and their tests are redis-stack's modules or asyncio twins.
LEFT_OUT = {"test_search.py"}
# Seconds one test may take before the plugin stops it (a hung command fails one test).
TEST_TIMEOUT = 120
NAMES = ["n0", "n1", "n2"]
NOT_RUN = "[not run]"


def pinned_version():
    for line in (TESTS / "requirements.txt").read_text().splitlines():
        m = re.match(r"\s*redis==(\S+)", line)
        if m:
            return m.group(1)
    raise SystemExit("tests/requirements.txt pins no redis version")


def sdist(version):
    """redis-py's unpacked source release (downloaded once into tests/.cache/)."""
    folder = CACHE / f"redis-{version}"
    if (folder / "tests" / "conftest.py").exists():
        return folder
    CACHE.mkdir(parents=True, exist_ok=True)
    archive = CACHE / f"redis-{version}.tar.gz"
    if not archive.exists():
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check",
                        "--no-binary", ":all:", "--no-deps", f"redis=={version}",
                        "-d", str(CACHE)], check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(CACHE, filter="data")
    return folder


def test_files(folder, files):
    """The test files to run, relative to the sdist (tests/test_x.py ...)."""
    if files:
        return [f if f.startswith("tests/") else f"tests/{f}" for f in files]
    found = sorted(p.name for p in (folder / "tests").glob("test_*.py"))
    return [f"tests/{f}" for f in found if f not in LEFT_OUT] + ["tests/test_parsers"]


# --- servers ---------------------------------------------------------------------------------


def start_plain(workdir):
    from helpers.server import RedisServer
    return [RedisServer(workdir, module=False).start()]


def start_fleet(workdir, ring, hashtag=None):
    """Three servers with the module and route-plain on, the ring set on each, pushed from n0."""
    from helpers.fleet import ring_args
    from helpers.server import RedisServer
    servers = {}
    for n in NAMES:
        servers[n] = RedisServer(Path(workdir) / n, module_args=["self", n, "route-plain", "yes"])
    try:
        for s in servers.values():
            s.start()
        args = (["HASHTAG", hashtag] if hashtag else []) + ring_args(servers, NAMES)
        for s in servers.values():
            assert s.client().execute_command("SHARD.RING", "SET", ring, *args) == b"OK"
        servers["n0"].client().execute_command("SHARD.RING", "PUSH")
    except BaseException:
        stop(servers.values())
        raise
    return list(servers.values())


def stop(servers):
    for s in servers:
        try:
            s.stop(signal.SIGKILL)
        except Exception:  # noqa: BLE001 - stopping whatever is left
            pass


# --- one pytest run of redis-py's suite ------------------------------------------------------


def run_suite(folder, urls, label, args, extra, deselect=()):
    """redis-py's tests against `urls` (one per worker), but those of `deselect`; the JUnit
    XML's path."""
    junit = OUT / f"{label}.xml"
    log = OUT / f"{label}.log"
    junit.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "helpers.redispy_plugin",
           # redis-py's sdist ships no pytest configuration: none of ours either (-c).
           "-c", os.devnull, "--rootdir", str(folder), "-q", "-m", MARKERS,
           f"--junitxml={junit}", "-o", "junit_family=xunit1", "--redis-url", urls[0]]
    if args.k:
        cmd += ["-k", args.k]
    if args.workers > 1:
        cmd += ["-n", str(args.workers), "--dist", "load"]
    for tid in deselect:
        cmd += ["--deselect", tid]
    cmd += [*extra, *test_files(folder, args.files)]
    env = dict(os.environ, REDISPY_URLS=",".join(urls), PYTHONUNBUFFERED="1",
               REDISPY_TEST_TIMEOUT=str(TEST_TIMEOUT),
               PYTHONPATH=os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    started = time.monotonic()
    summary = "?"
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=folder, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, errors="replace")
        for line in proc.stdout:
            out.write(line)
            if args.verbose:
                print(f"[{label}] {line}", end="", flush=True)
            if re.search(r"\d+ (passed|failed|skipped|deselected|errors?)\b", line) \
                    and line.strip().startswith(("=", "0", "1", "2", "3", "4", "5", "6", "7", "8", "9")):
                summary = line.strip(" =\n")
        proc.wait()
    print(f"  {label}: {summary} ({time.monotonic() - started:.0f} s; log {log.relative_to(ROOT)})",
          flush=True)
    return junit


def outcomes(junit, folder):
    """{pytest node id: 'passed' | 'failed' | 'skipped'} of a JUnit XML (a test with an error in
    its set-up or tear-down counts as failed) and {node id: first line of its failure}."""
    status, why = {}, {}
    try:
        cases = list(ET.parse(junit).iter("testcase"))
    except (OSError, ET.ParseError):
        return status, why
    for case in cases:
        tid = node_id(case, folder)
        bad = list(case.iter("failure")) + list(case.iter("error"))
        if bad:
            status[tid] = "failed"
            text = (bad[0].get("message") or bad[0].text or "").strip().splitlines()
            why.setdefault(tid, text[0][:300] if text else "?")
        elif case.find("skipped") is not None:
            status.setdefault(tid, "skipped")
        else:
            status.setdefault(tid, "passed")
    return status, why


def node_id(case, folder):
    """tests/test_commands.py::TestRedisCommands::test_get of a JUnit test case (its classname
    is dotted: the module's path, then its classes)."""
    parts = case.get("classname", "").split(".")
    for i in range(len(parts), 0, -1):
        path = "/".join(parts[:i]) + ".py"
        if (folder / path).exists():
            return "::".join([path, *parts[i:], case.get("name", "")])
    return case.get("classname", "") + "::" + case.get("name", "")


def expected():
    """{test id: reason} of tests/redispy_expected.txt."""
    out = {}
    if not EXPECTED.exists():
        return out
    for line in EXPECTED.read_text().splitlines():
        tid, _, reason = line.partition("#")
        if tid.strip():
            out[tid.strip()] = reason.strip()
    return out


def listed(tid, known):
    """The entry of the expected-failures list that names `tid` (its id, or its id without the
    parameters), or None."""
    return tid if tid in known else tid.split("[")[0] if tid.split("[")[0] in known else None


def counts(status):
    c = {"passed": 0, "failed": 0, "skipped": 0}
    for s in status.values():
        c[s] += 1
    return c


def main():
    argv = sys.argv[1:]
    extra = []
    if "--" in argv:
        extra = argv[argv.index("--") + 1:]
        argv = argv[:argv.index("--")]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", default=os.environ.get("REDIS_SERVER", "redis-server"),
                        help="the server binary (default redis-server)")
    parser.add_argument("-k", help="run only the tests that match this pytest -k expression")
    parser.add_argument("--files", nargs="+", help="run only these files of redis-py's tests/")
    parser.add_argument("--workers", type=int, default=1,
                        help="pytest-xdist workers, each with a server and a fleet of its own")
    parser.add_argument("--ring", default="ketama", choices=["ketama", "slots"],
                        help="the fleet's ring (default ketama)")
    parser.add_argument("--hashtag", help="the ring's hash-tag rule (HASHTAG cluster ...; "
                        "default: the algo's own)")
    parser.add_argument("--compare-only", action="store_true",
                        help="run nothing: compare the JUnit XML files of the last run")
    parser.add_argument("--verbose", "-v", action="store_true",
                        help="show pytest's output as it comes (else only in the logs)")
    args = parser.parse_args(argv)

    # tests/helpers read REDIS_SERVER when imported.
    os.environ["REDIS_SERVER"] = args.server
    sys.path.insert(0, str(TESTS))
    from helpers.server import SERVER_NAME, SERVER_VERSION

    folder = sdist(pinned_version())
    OUT.mkdir(parents=True, exist_ok=True)
    label = f"{SERVER_NAME}-{'.'.join(map(str, SERVER_VERSION))}"
    print(f"redis-py {pinned_version()}'s tests on {args.server} ({label}), "
          f"plain server then a fleet of three ({args.ring}, route-plain yes)", flush=True)
    results = {}
    for kind in ("plain", "fleet"):
        if args.compare_only:
            results[kind] = outcomes(OUT / f"{label}-{kind}.xml", folder)
            continue
        started = []
        try:
            urls = []
            for w in range(args.workers):
                work = OUT / f"{label}-{kind}-servers" / f"w{w}"
                shutil.rmtree(work, ignore_errors=True)
                group = (start_plain(work) if kind == "plain" else start_fleet(work, args.ring, args.hashtag))
                started += group
                urls.append(f"redis://127.0.0.1:{group[0].port}/0")
            # An expected failure marked `[not run]` leaves the fleet unusable for the tests
            # after it (the reason says how): it does not run there.
            skip = [t for t, why in expected().items() if why.startswith(NOT_RUN)]
            junit = run_suite(folder, urls, f"{label}-{kind}", args, extra,
                              skip if kind == "fleet" else ())
        finally:
            stop(started)
        results[kind] = outcomes(junit, folder)

    (plain, _), (fleet, fleet_why) = results["plain"], results["fleet"]
    if not plain:
        print("the run against the plain server left no results: see its log")
        return 2
    known = expected()
    regressions, listed_fails, stale = [], [], []
    for tid, outcome in sorted(plain.items()):
        if outcome != "passed":
            continue
        entry = listed(tid, known)
        got = fleet.get(tid, "not run")
        if got == "passed":
            if entry:
                stale.append((tid, known[entry]))
        elif entry:
            listed_fails.append(tid)
        else:
            regressions.append((tid, got, fleet_why.get(tid, "")))
    cp, cf = counts(plain), counts(fleet)
    print(f"== {label}: plain {cp['passed']} passed, {cp['failed']} failed, {cp['skipped']} "
          f"skipped; fleet {cf['passed']} passed, {cf['failed']} failed, {cf['skipped']} skipped; "
          f"{len(listed_fails)} of the expected failures failed")
    if stale:
        print(f"== in tests/redispy_expected.txt but passing on the fleet ({len(stale)}; stale "
              f"entries, or entries for another server):")
        for tid, reason in stale:
            print(f"  {tid}  # {reason}")
    if regressions:
        print(f"== passed on the plain server, not on the fleet, not expected ({len(regressions)}):")
        for tid, got, why in regressions:
            print(f"  {tid}  ({got})\n      {why}")
        return 1
    print("== every test that passed on the plain server passed on the fleet "
          "(or is an expected failure)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

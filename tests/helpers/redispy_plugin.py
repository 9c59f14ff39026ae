"""A pytest plugin for redis-py's own test suite as tests/redispy_suite.py runs it (`-p
helpers.redispy_plugin`, with tests/ on PYTHONPATH). redis-py's tests stay unchanged; the plugin
only

- registers redis-py's markers (its sdist ships no pytest configuration);
- gives each pytest-xdist worker a server (or fleet) of its own: REDISPY_URLS holds one
  `--redis-url` per worker (gw0, gw1, ...), since redis-py's tests flush the database after
  each test and count its keys, and so cannot share one;
- stops a test that hangs after REDISPY_TEST_TIMEOUT seconds (SIGALRM), so that one hung
  command fails its test instead of the whole run (pytest writes the JUnit XML only at the
  end).
"""

import os
import signal

import pytest

MARKERS = ("onlycluster", "onlynoncluster", "redismod", "ssl", "graph", "experimental",
           "replica", "timeout", "asyncio")


def pytest_configure(config):
    for name in MARKERS:
        config.addinivalue_line("markers", f"{name}: redis-py's marker")
    urls = [u for u in os.environ.get("REDISPY_URLS", "").split(",") if u]
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    if urls:
        config.option.redis_url = urls[int(worker.removeprefix("gw")) % len(urls)]


class TestTimedOut(Exception):
    """The test ran longer than REDISPY_TEST_TIMEOUT seconds."""


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    seconds = int(os.environ.get("REDISPY_TEST_TIMEOUT", "0"))
    if not seconds:
        return (yield)

    def expired(signum, frame):
        raise TestTimedOut(f"{item.nodeid} ran over {seconds} s")

    old = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        return (yield)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)

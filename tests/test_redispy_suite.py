"""A part of redis-py's own test suite against a route-plain fleet (issue 43, "a real client's
own test suite passes on the fleet"): tests/redispy_suite.py runs the part below against one
plain server of REDIS_SERVER, then against one node of a three-node fleet, and fails when a test
passes on the plain server and not on the fleet without tests/redispy_expected.txt naming it.
`make redis-py-suite` runs the whole suite on every server.

The part: the commands of the data (strings, lists, hashes, sets, sorted sets, SCAN), pipelines
and transactions, scripting, functions, pub/sub (redis-py's lock, encoding and hash tests run in
`make redis-py-suite`, with the rest, to keep `make test` within its time). It is marked `serial`: redis-py's
tests wait on timeouts of a second or less (BLPOP, pub/sub), which tests running beside it would
stretch; and it starts its own pytest with servers of its own.
"""

import subprocess
import sys
from pathlib import Path

import pytest

from helpers.server import REDIS_SERVER

ROOT = Path(__file__).resolve().parent.parent
FILES = ["test_commands.py", "test_pipeline.py", "test_scripting.py", "test_function.py",
         "test_pubsub.py"]
# In test_commands.py, the tests of the data commands (their names start with the command:
# test_set..., test_sadd, test_hset, test_lpush, test_zadd, test_incr, test_scan ...).
DATA = ("not TestRedisCommands or test_get or test_set or test_s or test_h or test_l or test_r "
        "or test_z or test_incr or test_decr or test_append or test_m or test_exists or test_del "
        "or test_expire or test_ttl or test_type")


@pytest.mark.serial
@pytest.mark.slow
def test_redispy_suite_part_passes_on_the_fleet():
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "redispy_suite.py"),
                           "--server", REDIS_SERVER, "--workers", "2", "--files", *FILES,
                           "-k", DATA],
                          cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]

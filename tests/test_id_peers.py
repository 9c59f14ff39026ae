"""The tsid, uuidv7 and ulid layouts agree with the libraries applications use (issue 34),
installed from the registries: PyPI's `uuid6`, `uuid-utils` (the Rust `uuid` crate), `python-ulid`
and `tsidpy` (tests/requirements.txt), npm's `uuid`, `ulid` and `tsid-ts`
(tests/oracles/ids/ids_oracle.mjs, installed by helpers.npm).

Both ways, 100% agreement on at least 10 000 IDs per library: each library parses every ID
SHARD.GENKEY issues (and the edge IDs SHARD.ENCODE builds: the epoch, the last millisecond a
layout holds, counters, nodes and random bits at their maximum), reads the same millisecond and,
for UUIDs, version 7 and variant 10; and SHARD.DECODE reads every ID the library makes (now, at
random times and at the edges) to the library's millisecond.
"""

import json
import random
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest
import tsidpy
import ulid as python_ulid
import uuid6
import uuid_utils

from helpers.ids import TSID_EPOCH, Ids, to_crockford, uuid_text
from helpers.npm import npm_folder
from helpers.server import pipelined

ORACLE = Path(__file__).resolve().parent / "oracles" / "ids"
NPM_UUID = "14.0.3"
N = 10_000
MAX48 = 2**48 - 1
MAX_TSID_MS = 2**42 - 1


@pytest.fixture(scope="session")
def npm_ids(tmp_path_factory):
    """The npm oracle: a function of a request (see ids_oracle.mjs) to its answer."""
    assert shutil.which("node"), "node runs the npm peers of the ID layouts"
    directory = npm_folder(tmp_path_factory, ORACLE, ("package.json", "ids_oracle.mjs"),
                           "uuid", NPM_UUID)

    def ask(request):
        done = subprocess.run(["node", str(directory / "ids_oracle.mjs")],
                              input=json.dumps(request).encode(), capture_output=True,
                              timeout=120)
        assert done.returncode == 0, done.stderr.decode(errors="replace")
        return json.loads(done.stdout)
    return ask


def ours(server_factory, layout, node_id=1023):
    """At least N IDs of GENKEY (text) and the edge IDs of ENCODE, as str."""
    c = server_factory(module_args=["layout", layout, "node-id", node_id]).client()
    keys = []
    while len(keys) < N:
        keys += c.execute_command("SHARD.GENKEY", "COUNT", 5000)
    if layout == "uuidv7":
        edges = [["TIME", 0], ["TIME", MAX48, "SEQ", 2**24 - 1, "NODE", 1023, "RANDOM", "f" * 10],
                 ["TIME", MAX48], ["TIME", 0, "SEQ", 2**24 - 1]]
    elif layout == "ulid":
        edges = [["TIME", 0], ["TIME", MAX48, "NODE", 1023, "RANDOM", "3" + "f" * 17],
                 ["TIME", MAX48], ["TIME", 0, "NODE", 1023, "RANDOM", "3" + "f" * 17]]
    else:
        edges = [["TIME", TSID_EPOCH], ["TIME", TSID_EPOCH + MAX_TSID_MS, "NODE", 1023, "SEQ", 4095],
                 ["TIME", TSID_EPOCH + MAX_TSID_MS], ["TIME", TSID_EPOCH, "NODE", 1023, "SEQ", 4095]]
    keys += [c.execute_command("SHARD.ENCODE", *e) for e in edges]
    return c, [k.decode() for k in keys]


def decode_ms(client, layout, keys, fmt=None):
    """SHARD.DECODE's time_ms of each key."""
    extra = ["FORMAT", fmt] if fmt else []
    replies = pipelined(client, [("SHARD.DECODE", k, "LAYOUT", layout, *extra) for k in keys])
    return [dict(zip(r[::2], r[1::2]))[b"time_ms"] for r in replies]


# --- UUIDv7 -------------------------------------------------------------------------------------


def test_uuid_libraries_read_our_uuidv7s(server_factory, npm_ids):
    c, keys = ours(server_factory, "uuidv7")
    ids = Ids("uuidv7")
    want = [ids.value(k) >> 80 for k in keys]
    assert want[-4:] == [0, MAX48, MAX48, 0]
    for k, ms in zip(keys, want):
        a = uuid6.UUID(k)
        assert (a.version, a.variant, a.time) == (7, uuid.RFC_4122, ms), k
        b = uuid_utils.UUID(k)
        assert (b.version, b.variant, b.timestamp) == (7, "specified in RFC 4122", ms), k
        assert uuid6.UUID(bytes=uuid.UUID(k).bytes).time == ms
    got = npm_ids({"parse": {"uuidv7": keys}})["parse"]["uuidv7"]
    assert got == [[True, 7, ms, 2] for ms in want]


def test_we_read_the_uuid_libraries_uuidv7s(r, npm_ids):
    rng = random.Random(3407)
    theirs = [str(uuid6.uuid7()) for _ in range(N)] + [str(uuid_utils.uuid7()) for _ in range(N)]
    at = [0, 1, MAX48 - 1, MAX48] + [rng.randrange(MAX48) for _ in range(N)]
    theirs += [str(uuid_utils.uuid7(nanoseconds=ms * 10**6)) for ms in at]
    theirs += [str(uuid6.UUID(int=(ms << 80) | rng.getrandbits(80), version=7)) for ms in at]
    want = [uuid6.UUID(t).time for t in theirs]
    assert decode_ms(r, "uuidv7", theirs) == want
    # npm uuid's v7, with its own options at the edges: 32-bit seq, random bytes.
    request = [[ms, seq, rnd] for ms in at[:2000]
               for seq, rnd in [(rng.randrange(2**32), f"{rng.getrandbits(128):032x}")]]
    request += [[0, 0, "0" * 32], [MAX48, 2**32 - 1, "f" * 32], [MAX48, 2**31 - 1, "0" * 32]]
    request += [[rng.randrange(MAX48), rng.randrange(2**32), f"{rng.getrandbits(128):032x}"]
                for _ in range(N - len(request))]
    made = npm_ids({"make": {"uuidv7": request}})["made"]["uuidv7"]
    assert len(made) >= N
    assert decode_ms(r, "uuidv7", made) == [ms for ms, _, _ in request]
    # ... and in binary and hex form.
    assert decode_ms(r, "uuidv7", [uuid.UUID(t).bytes for t in made[:2000]], "binary") == \
        [ms for ms, _, _ in request[:2000]]
    assert decode_ms(r, "uuidv7", [uuid.UUID(t).hex for t in made[:2000]]) == \
        [ms for ms, _, _ in request[:2000]]


# --- ULID ---------------------------------------------------------------------------------------


def test_ulid_libraries_read_our_ulids(server_factory, npm_ids):
    c, keys = ours(server_factory, "ulid")
    ids = Ids("ulid")
    want = [ids.value(k) >> 80 for k in keys]
    assert want[-4:] == [0, MAX48, MAX48, 0]
    for k, ms in zip(keys, want):
        u = python_ulid.ULID.from_str(k)
        assert (u.milliseconds, str(u)) == (ms, k)
    assert npm_ids({"parse": {"ulid": keys}})["parse"]["ulid"] == [[True, ms] for ms in want]


def test_we_read_the_ulid_libraries_ulids(r, npm_ids):
    rng = random.Random(1469918176385)
    theirs = [str(python_ulid.ULID()) for _ in range(N)]
    at = [0, 1, MAX48 - 1, MAX48] + [rng.randrange(MAX48) for _ in range(N)]
    theirs += [str(python_ulid.ULID.from_int((ms << 80) | rng.getrandbits(80))) for ms in at]
    theirs += [str(python_ulid.ULID.from_int((ms << 80) | (2**80 - 1))) for ms in at[:4]]
    want = [python_ulid.ULID.from_str(t).milliseconds for t in theirs]
    assert decode_ms(r, "ulid", theirs) == want
    request = [[ms, kind] for ms in at[:4] for kind in ("min", "max", "random")]
    request += [[ms, "random"] for ms in at[4:]]
    answer = npm_ids({"make": {"ulid": request, "ulid_monotonic": [[1700000000000, 2000]]}})["made"]
    assert decode_ms(r, "ulid", answer["ulid"]) == [ms for ms, _ in request]
    assert "7ZZZZZZZZZZZZZZZZZZZZZZZZZ" in answer["ulid"]
    mono = answer["ulid_monotonic"]
    assert decode_ms(r, "ulid", mono) == [1700000000000] * 2000
    # The factory's IDs are one apart; so are ours within a millisecond.
    randoms = [int(d[b"random"], 16) for d in (
        dict(zip(x[::2], x[1::2])) for x in pipelined(
            r, [("SHARD.DECODE", m, "LAYOUT", "ulid", "FORMAT", "text") for m in mono]))]
    assert all(b - a == 1 for a, b in zip(randoms, randoms[1:]))


def test_our_ulids_count_up_by_one_within_a_millisecond(server_factory):
    c = server_factory(module_args=["layout", "ulid"]).client()
    keys = [python_ulid.ULID.from_str(k.decode()) for k in c.execute_command("SHARD.GENKEY", "COUNT", 20000)]
    steps = [(b.milliseconds - a.milliseconds, int(b) - int(a)) for a, b in zip(keys, keys[1:])]
    assert all(d_ms > 0 or d == 1 for d_ms, d in steps)
    assert sum(d_ms == 0 for d_ms, _ in steps) > 10000


# --- TSID ---------------------------------------------------------------------------------------


def test_tsid_libraries_read_our_tsids(server_factory, npm_ids):
    c, keys = ours(server_factory, "tsid")
    ids = Ids("tsid")
    values = [ids.value(k) for k in keys]
    want = [ids.ms(v) for v in values]
    assert want[-4:] == [TSID_EPOCH, TSID_EPOCH + MAX_TSID_MS, TSID_EPOCH + MAX_TSID_MS, TSID_EPOCH]
    decimals = [c.execute_command("SHARD.ENCODE", "TIME", ms, "NODE", ids.node(v),
                                  "SEQ", v & 4095, "FORMAT", "decimal").decode()
                for ms, v in zip(want[:2000], values[:2000])]
    decimals += [str(v) for v in values[2000:]]
    for k, d, v, ms in zip(keys, decimals, values, want):
        t = tsidpy.TSID.from_string(k)
        assert (int(t.timestamp), t.number, t.random) == (ms, v, v & (2**22 - 1)), k
        assert (tsidpy.TSID.from_string(d, "d").number, tsidpy.TSID(int(d)).to_string()) == (v, k)
    got = npm_ids({"parse": {"tsid": keys, "tsid_decimal": decimals}})["parse"]
    assert got["tsid"] == [[ms, v & (2**22 - 1), str(v)] for ms, v in zip(want, values)]
    assert got["tsid_decimal"] == [[ms, v & (2**22 - 1), str(v), k]
                                   for ms, v, k in zip(want, values, keys)]
    assert {ids.node(v) for v in values[:N]} == {1023}


def test_we_read_the_tsid_libraries_tsids(r, npm_ids):
    rng = random.Random(2020)
    gens = [tsidpy.TSIDGenerator(node=n, node_bits=10) for n in (0, 1023)]
    theirs = [str(g.create()) for g in gens for _ in range(N // 2)]
    at = [0, 1, MAX_TSID_MS - 1, MAX_TSID_MS] + [rng.randrange(MAX_TSID_MS) for _ in range(N)]
    theirs += [str(tsidpy.TSID((ms << 22) | rng.getrandbits(22))) for ms in at]
    theirs += [str(tsidpy.TSID((ms << 22) | (2**22 - 1))) for ms in at[:4]]
    want = [int(tsidpy.TSID.from_string(t).timestamp) for t in theirs]
    assert decode_ms(r, "tsid", theirs) == want
    numbers = [str(tsidpy.TSID.from_string(t).number) for t in theirs]
    assert decode_ms(r, "tsid", numbers) == want, "their decimal form"
    lows = [rng.getrandbits(22) for _ in at]
    answer = npm_ids({"make": {"tsid": [[ms, low] for ms, low in zip(at, lows)],
                               "tsid_now": [[5, 10, 2000], [77, 8, 2000]]}})["made"]
    assert decode_ms(r, "tsid", answer["tsid"]) == [TSID_EPOCH + ms for ms in at]
    assert answer["tsid"][3] == "F" + to_crockford((MAX_TSID_MS << 22) | lows[3], 13)[1:]
    now = answer["tsid_now"]
    replies = pipelined(r, [("SHARD.DECODE", t, "LAYOUT", "tsid") for t in now[:2000]])
    assert {dict(zip(x[::2], x[1::2]))[b"node"] for x in replies} == {5}


def test_uuid_text_helper_matches_the_standard_library():
    n = random.Random(1).getrandbits(128)
    assert uuid_text(n) == str(uuid.UUID(int=n))

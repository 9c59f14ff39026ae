"""Keys that put rings to the test, always the same: random ASCII, hash-tag edge cases for every
tag rule, UTF-8 and bytes that are not UTF-8 (`key_set`), and one key per cluster hash slot
(`slot_keys`). The ring tests compare the module's owners of these keys with the peers' and the
real cluster's.
"""

import binascii
import functools
import random

KEY_COUNT = 10000

# Hash-tag edge cases for every rule (cluster, jedis, greedy): empty tags, nested and repeated
# braces, tags across lines, java line terminators (U+0085, U+2028, U+2029), and names that
# are special in JavaScript objects.
EDGE_KEYS = [
    b"", b"{}", b"{{a}}", b"a{b}c{d}", b"{}x{y}", b"{", b"}", b"}{", b"{a", b"a}", b"{a}",
    b"{ab}", b"{{}}", b"{}{}", b"{{}", b"{}}", b"a{}b", b"a{b{c}d}", b"a{b}c{d}e", b"{a}{b}",
    b"}a{b}", b"{user1}.following", b"{user1}.followers", b"foo{hash_tag}", b"somekey",
    b"user:{42}:name", b"{x}" * 5, b"{" * 8 + b"}" * 8, b"x{\n}y", b"{a\nb}", b"a\n{b}",
    b"{b}\n{c}", b"{\r}", b"a{\r\n}b", b"\n", b"\r\n", b"{\n}", b" ", b"\t{ }", b"{ }",
    b"\x00", b"{\x00}", b"a\x00{b}\x00", b"__proto__", b"valueOf", b"hasOwnProperty",
    b"constructor", b"toString", b"123", b"0", b"-1",
    "{\u00e9}".encode(), "\u00e9t\u00e9".encode(), "{\u0085}".encode(), "a{\u0085b}c".encode(),
    "a{\u2028}b".encode(), "{\u2029x}".encode(), "{x\u2028}".encode(), "\u4e2d\u6587{\u952e}".encode(),
    "\U0001f600{\U0001f511}".encode(), "{\ufeff}".encode(), "\u00ff{\u00fe}".encode(),
]
# Not UTF-8: only for the peers that take any bytes (redis-shard, jedis, cluster slots).
EDGE_BYTES = [
    b"\xff", b"{\xff}", b"a{\xfe\xff}b", b"\x85", b"{\x85}", b"\x85{a\x85b}", b"{a\x85}",
    b"\x80", b"{\xc3}", b"\xc3\xa9\xff", b"{\xe2\x80}", b"\xed\xa0\x80", b"{\xc0\xaf}",
]

TAGGY = "{}{}ab\n"
UNICODE_RANGES = [
    (0xA0, 0xFF), (0x100, 0x17F), (0x391, 0x3C9), (0x4E00, 0x4EFF), (0x1F600, 0x1F64F),
]


def _ascii(rng, lo=0, hi=24):
    return "".join(chr(rng.randrange(32, 127)) for _ in range(rng.randint(lo, hi)))


def _unicode(rng, lo=1, hi=10):
    out = []
    for _ in range(rng.randint(lo, hi)):
        r = rng.random()
        if r < 0.3:
            out.append(chr(rng.randrange(32, 127)))
        elif r < 0.4:
            out.append(rng.choice("{}{}\u0085\u2028\u2029\n"))
        else:
            a, b = rng.choice(UNICODE_RANGES)
            out.append(chr(rng.randint(a, b)))
    return "".join(out)


def _random_key(rng):
    r = rng.random()
    if r < 0.40:  # plain ASCII, sometimes with braces
        return _ascii(rng).encode()
    if r < 0.55:  # prefix{tag}suffix
        return f"{_ascii(rng, 0, 8)}{{{_ascii(rng, 0, 6)}}}{_ascii(rng, 0, 8)}".encode()
    if r < 0.70:  # brace soup: exercises every tag rule's corner
        return "".join(rng.choice(TAGGY) for _ in range(rng.randint(1, 10))).encode()
    if r < 0.90:  # UTF-8, not ASCII
        return _unicode(rng).encode()
    # any bytes (mostly not UTF-8), sometimes with braces around
    raw = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
    return raw if rng.random() < 0.5 else b"x{" + raw + b"}y"


def is_utf8(key):
    try:
        key.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


@functools.lru_cache(maxsize=None)
def key_set(utf8_only):
    """At least KEY_COUNT distinct keys, always the same; `utf8_only` drops non-UTF-8 ones."""
    rng = random.Random(20240603)
    keys = dict.fromkeys(EDGE_KEYS if utf8_only else EDGE_KEYS + EDGE_BYTES)
    while len(keys) < KEY_COUNT:
        k = _random_key(rng)
        if not utf8_only or is_utf8(k):
            keys[k] = None
    out = tuple(keys)
    assert len(out) >= KEY_COUNT
    assert all(is_utf8(k) for k in out) if utf8_only else not all(is_utf8(k) for k in out)
    return out


@functools.lru_cache(maxsize=None)
def slot_keys():
    """One key per hash slot, 16384 in all, so that a slots ring is checked on every slot.
    Found with CRC-16/XMODEM (binascii.crc_hqx); the tests check each against CLUSTER KEYSLOT."""
    found = {}
    n = 0
    while len(found) < 16384:
        key = b"slot-%d" % n
        found.setdefault(binascii.crc_hqx(key, 0) & 16383, key)
        n += 1
    return tuple(found[s] for s in range(16384))


def key_slot(key):
    """`CLUSTER KEYSLOT key`: Redis Cluster's hash-tag rule, then CRC-16/XMODEM mod 16384."""
    key = key.encode() if isinstance(key, str) else key
    start = key.find(b"{")
    if start >= 0:
        end = key.find(b"}", start + 1)
        if end > start + 1:
            key = key[start + 1:end]
    return binascii.crc_hqx(key, 0) & 16383

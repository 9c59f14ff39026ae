"""COMMAND INFO and COMMAND DOCS describe every command and subcommand like a native one."""

import pytest

from helpers.resp import raw_reply

COMMANDS = {
    "shard.genkey": (-1, {"write", "denyoom", "fast"}),
    "shard.decode": (-2, {"readonly", "fast"}),
    "shard.encode": (-1, {"readonly", "fast"}),
    "shard.whereis": (2, {"readonly", "fast"}),
    "shard.locate": (2, {"readonly", "fast"}),
    "shard.hotkeys": (-1, {"readonly", "noscript", "blocking"}),
    "shard.call": (-2, {"noscript", "blocking"}),
    "shard.watch": (-2, {"noscript", "blocking"}),
    "shard.unwatch": (1, {"noscript", "fast"}),
    "shard.multi": (1, {"noscript", "fast"}),
    "shard.discard": (1, {"noscript", "fast"}),
    "shard.exec": (1, {"noscript", "blocking"}),
    "shard.locked": (-2, {"blocking"}),
}
SUBCOMMANDS = {
    "shard.ring": {"set": (-3, {"admin"}), "get": (2, {"readonly", "fast"}), "begin": (-3, {"admin"}),
                   "settle": (-2, {"admin"}), "commit": (-2, {"admin"}), "abort": (-2, {"admin"}),
                   "install": (-3, {"admin"}), "state": (2, {"readonly"}),
                   "push": (2, {"admin", "blocking"}), "check": (2, {"admin", "blocking"}),
                   "lease": (-7, {"admin"})},
    "shard.reshard": {"copy": (-2, {"admin"}), "cleanup": (-2, {"admin", "write"}),
                      "status": (2, {"readonly", "fast"}), "stop": (-2, {"admin"}),
                      "throttle": (3, {"admin"}), "pause": (2, {"admin"}),
                      "resume": (2, {"admin", "blocking"}),
                      "start": (-3, {"admin", "blocking"}), "cancel": (2, {"admin", "blocking"}),
                      "handover": (2, {"admin"}), "plan": (-2, {"admin"})},
    "shard.txn": {"watch": (-5, {"fast"}), "read": (-5, {"readonly"}), "unwatch": (3, {"fast"}), "apply": (-5, {"write"}),
                  "prepare": (-6, {"write"}), "commit": (-3, {"write"}), "abort": (3, {"write"}),
                  "status": (3, {"write", "fast"}), "decide": (-4, {"write"}),
                  "forget": (3, {"write"}), "sync": (2, {"fast"})},
}


def info(client, name):
    return raw_reply(client, "COMMAND", "INFO", name)[0]


def flags_of(entry):
    return {f.decode() if isinstance(f, bytes) else f for f in entry[2]}


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_command_info_arity_and_flags(r, name):
    arity, flags = COMMANDS[name]
    entry = info(r, name)
    assert entry[1] == arity
    assert flags <= flags_of(entry), flags_of(entry)
    assert (entry[3], entry[4], entry[5]) == (0, 0, 0), "no key positions: no CROSSSLOT in cluster mode"


def test_subcommands_are_real(r):
    for parent, subs in SUBCOMMANDS.items():
        entry = info(r, parent)
        listed = {e[0].decode() for e in entry[9]}
        assert listed == {f"{parent}|{s}" for s in subs}
        for sub in entry[9]:
            arity, flags = subs[sub[0].decode().split("|")[1]]
            assert sub[1] == arity and flags <= flags_of(sub), sub


def test_command_docs_summary_and_arguments(r):
    docs = raw_reply(r, "COMMAND", "DOCS", "shard.genkey", "shard.encode", "shard.ring")
    docs = dict(zip(docs[::2], docs[1::2]))
    genkey = dict(zip(docs[b"shard.genkey"][::2], docs[b"shard.genkey"][1::2]))
    assert b"time-sorted unique keys" in genkey[b"summary"]
    assert genkey[b"module"] == b"shard"
    args = [dict(zip(a[::2], a[1::2])) for a in genkey[b"arguments"]]
    assert [(a[b"name"], a[b"token"], a[b"type"]) for a in args] == [
        (b"type", b"TYPE", b"string"), (b"count", b"COUNT", b"integer"),
        (b"format", b"FORMAT", b"string"), (b"layout", b"LAYOUT", b"string")]
    assert all(b"optional" in a[b"flags"] for a in args)
    encode = dict(zip(docs[b"shard.encode"][::2], docs[b"shard.encode"][1::2]))
    names = [dict(zip(a[::2], a[1::2]))[b"name"] for a in encode[b"arguments"]]
    assert names == [b"layout", b"epoch", b"when", b"node", b"seq", b"type", b"suffix", b"random",
                     b"format"]
    ring = dict(zip(docs[b"shard.ring"][::2], docs[b"shard.ring"][1::2]))
    subs = ring[b"subcommands"]
    subs = dict(zip(subs[::2], subs[1::2]))
    assert set(subs) == {b"shard.ring|set", b"shard.ring|get", b"shard.ring|begin",
                         b"shard.ring|settle", b"shard.ring|commit", b"shard.ring|abort",
                         b"shard.ring|install", b"shard.ring|state", b"shard.ring|push",
                         b"shard.ring|check", b"shard.ring|lease"}
    # INSTALL's arguments end with one optional mark of the rings, then the term (a
    # coordinator's step) or the pushing node's term (SHARD.RING PUSH).
    install = dict(zip(subs[b"shard.ring|install"][::2], subs[b"shard.ring|install"][1::2]))
    mark = dict(zip(install[b"arguments"][-3][::2], install[b"arguments"][-3][1::2]))
    term, pushed = ({k: v for k, v in zip(a[::2], a[1::2])} for a in install[b"arguments"][-2:])
    assert (term[b"token"], pushed[b"token"]) == (b"TERM", b"PUSHED")
    assert all(b"optional" in a[b"flags"] for a in (term, pushed))
    assert mark[b"type"] == b"oneof" and b"optional" in mark[b"flags"], mark
    assert [dict(zip(a[::2], a[1::2]))[b"token"] for a in mark[b"arguments"]] == [
        b"RETURNING", b"FENCE", b"SETTLED"]


def test_the_node_block_of_a_ring_documents_its_slot_ranges(r):
    """SHARD.RING SET/BEGIN and SHARD.RESHARD START: each node is `name address weight`, then an
    optional `SLOTS ranges` (a `slots` ring's explicit slot map)."""
    def node_block(parent, sub):
        docs = raw_reply(r, "COMMAND", "DOCS", parent)
        top = dict(zip(docs[1][::2], docs[1][1::2]))
        subs = dict(zip(top[b"subcommands"][::2], top[b"subcommands"][1::2]))
        entry = dict(zip(subs[f"{parent}|{sub}".encode()][::2],
                         subs[f"{parent}|{sub}".encode()][1::2]))
        args = [dict(zip(a[::2], a[1::2])) for a in entry[b"arguments"]]
        node = [a for a in args if a[b"name"] == b"node"][0]
        assert node[b"type"] == b"block" and b"multiple" in node[b"flags"]
        return [dict(zip(a[::2], a[1::2])) for a in node[b"arguments"]]

    for parent, sub in (("shard.ring", "set"), ("shard.ring", "begin"), ("shard.reshard", "start")):
        fields = node_block(parent, sub)
        assert [f[b"name"] for f in fields] == [b"name", b"address", b"weight", b"ranges"]
        assert fields[3][b"token"] == b"SLOTS" and b"optional" in fields[3][b"flags"]
        assert all(b"token" not in f for f in fields[:3])


def test_shard_call_documents_its_wait_prefix(r):
    """SHARD.CALL [WAIT numreplicas timeout-ms] command [arg ...] (a keyless command answers for
    the fleet, or here: issue 43)."""
    docs = raw_reply(r, "COMMAND", "DOCS", "shard.call")
    entry = dict(zip(docs[1][::2], docs[1][1::2]))
    assert b"replicas" in entry[b"summary"]
    args = [dict(zip(a[::2], a[1::2])) for a in entry[b"arguments"]]
    assert [(a[b"name"], a[b"type"]) for a in args] == [
        (b"wait", b"block"), (b"command", b"string"), (b"arg", b"string")]
    wait = args[0]
    assert wait[b"token"] == b"WAIT" and b"optional" in wait[b"flags"]
    assert b"multiple" not in wait.get(b"flags", [])
    inside = [dict(zip(a[::2], a[1::2])) for a in wait[b"arguments"]]
    assert [(a[b"name"], a[b"type"]) for a in inside] == [
        (b"numreplicas", b"integer"), (b"timeout-ms", b"integer")]

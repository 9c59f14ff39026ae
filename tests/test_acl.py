"""Access control: the README's ACL recipes, by command and subcommand name (Redis 7.0 gives
module commands no ACL categories), and secrets that never show."""

import time

import pytest
import redis

# The recipes, exactly as the README gives them.
APP = ("on >app-pw ~* &* +@read +@write +@connection +shard.genkey +shard.decode +shard.encode "
       "+shard.whereis +shard.locate +shard.call +shard.ring|get +shard.reshard|status")
READER = ("on >reader-pw ~* +@read +@connection +shard.decode +shard.encode +shard.whereis "
          "+shard.locate +shard.ring|get")
OPERATOR = ("on >op-pw ~* &* +@all")


def make_user(admin, name, recipe):
    admin.execute_command("ACL", "SETUSER", name, "reset", *recipe.split())


def as_user(server, name, password):
    return server.client(username=name, password=password)


@pytest.fixture
def fleet(server_factory):
    s = server_factory(module_args=["self", "a"])
    admin = s.client()
    admin.execute_command("SHARD.RING", "SET", "ketama", "a", f"127.0.0.1:{s.port}", 1)
    make_user(admin, "app", APP)
    make_user(admin, "reader", READER)
    make_user(admin, "operator", OPERATOR)
    return s


def noperm(fn, *args):
    with pytest.raises(redis.exceptions.NoPermissionError):
        fn(*args)


def test_application_user_generates_looks_up_and_calls_but_cannot_change_rings(fleet):
    app = as_user(fleet, "app", "app-pw")
    key = app.execute_command("SHARD.GENKEY")
    assert app.execute_command("SHARD.DECODE", key)
    assert app.execute_command("SHARD.ENCODE", "TIME", 1700000000000)
    assert app.execute_command("SHARD.WHEREIS", "user:1") == b"a"
    assert app.execute_command("SHARD.LOCATE", "user:1")
    assert app.execute_command("SHARD.CALL", "SET", "user:1", "x") == b"OK"
    assert app.execute_command("SHARD.RING", "GET")
    assert app.execute_command("SHARD.RESHARD", "STATUS")
    ring = ["ketama", "a", f"127.0.0.1:{fleet.port}", 1]
    for cmd in (["SHARD.RING", "SET", *ring], ["SHARD.RING", "BEGIN", *ring], ["SHARD.RING", "COMMIT"],
                ["SHARD.RING", "ABORT"], ["SHARD.RESHARD", "COPY"], ["SHARD.RESHARD", "CLEANUP"],
                ["SHARD.RESHARD", "STOP"], ["SHARD.ADVANCE", "1"]):
        noperm(app.execute_command, *cmd)


def test_read_only_user_cannot_generate(fleet):
    reader = as_user(fleet, "reader", "reader-pw")
    noperm(reader.execute_command, "SHARD.GENKEY")
    noperm(reader.execute_command, "SHARD.CALL", "GET", "k")
    assert reader.execute_command("SHARD.WHEREIS", "k") == b"a"
    assert reader.execute_command("SHARD.ENCODE", "TIME", 1700000000000)
    assert reader.execute_command("SHARD.RING", "GET")
    noperm(reader.execute_command, "SHARD.RING", "SET", "ketama", "a", "127.0.0.1:1", 1)


def test_operator_changes_rings_and_runs_jobs(fleet):
    op = as_user(fleet, "operator", "op-pw")
    assert op.execute_command("SHARD.RING", "BEGIN", "ketama", "a", f"127.0.0.1:{fleet.port}", 1,
                              "b", "127.0.0.1:1", 1) == b"OK"
    assert op.execute_command("SHARD.RING", "ABORT") == b"OK"
    assert op.execute_command("SHARD.RESHARD", "STATUS")


def test_subcommand_rules_work_like_config_get(fleet):
    admin = fleet.client()
    admin.execute_command("ACL", "SETUSER", "ringreader", "on", ">x", "+shard.ring|get", "-shard.ring|set")
    u = as_user(fleet, "ringreader", "x")
    assert u.execute_command("SHARD.RING", "GET")
    noperm(u.execute_command, "SHARD.RING", "SET", "ketama", "a", "127.0.0.1:1", 1)


def test_secrets_never_show(server_factory):
    s = server_factory(module_args=["auth-user", "mover", "auth-password", "topsecret-42"])
    c = s.client()
    c.execute_command("SHARD.RING", "SET", "ketama", "a", "127.0.0.1:1", 1)
    shown = [c.execute_command("SHARD.RING", "GET"), c.info("everything"),
             c.execute_command("SHARD.RESHARD", "STATUS")]
    assert "topsecret-42" not in repr(shown)
    # A failed MIGRATE's error (in STATUS and the log) does not carry the password either.
    c.execute_command("SHARD.RING", "BEGIN", "ketama", "b", "127.0.0.1:2", 1)
    c.config_set("shard.self", "a")
    c.set("k", "v")
    c.execute_command("SHARD.RESHARD", "COPY", "TIMEOUT", 100)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        st = c.execute_command("SHARD.RESHARD", "STATUS")
        if st[1] not in (b"copying",):
            break
        time.sleep(0.05)
    assert st[1] == b"failed" and b"127.0.0.1:2" in st[st.index(b"last_error") + 1]
    assert b"topsecret-42" not in b"".join(x for x in st if isinstance(x, bytes))
    assert "topsecret-42" not in s.log()

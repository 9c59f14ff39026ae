"""Access control: the README's ACL recipes, by command and subcommand name (Redis 7.0 gives
module commands no ACL categories), the categories the module gives its commands where the
server has them (Valkey, Redis 7.2+), and secrets that never show."""

import re
import time

import pytest
import redis

from helpers.fleet import start_fleet
from helpers.resp import raw_reply
from helpers.server import MODULE_ACL_CATEGORIES, ROOT

# The recipes, read from the pages that give them to users (the README, or the access control
# page of docs/), so that what they tell users is what is tested.
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def recipe(user):
    for page in PAGES:
        found = re.search(rf"^ACL SETUSER {user} (.+)$", page.read_text(), re.M)
        if found:
            return found.group(1)
    raise AssertionError(f"neither the README nor docs/ gives a recipe for {user}")


APP = recipe("app")
READER = recipe("reader")
OPERATOR = ("on >op-pw ~* &* +@all")


def make_user(admin, name, recipe):
    admin.execute_command("ACL", "SETUSER", name, "reset", *recipe.split())


def as_user(server, name, password):
    return server.client(username=name, password=password)


@pytest.fixture
def fleet(server_factory):
    s = start_fleet(server_factory, ["a"])["a"]
    admin = s.client()
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
    # A call whose key is on this node runs as the plain command (the command filter), so the
    # plain command's permissions decide: the reader may GET, and may not SET, either way.
    noperm(reader.execute_command, "SHARD.CALL", "SET", "k", "v")
    assert reader.execute_command("SHARD.CALL", "GET", "k") is None
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


# ---------------------------------------------------------------------------------------------
# Every admin command and subcommand, found in the server's command table (so a new one is
# tried without changing this file), against the recipes and the common category rules.
# ---------------------------------------------------------------------------------------------


def command_entries(client):
    """(full name, arity, flags, categories) of every shard command and subcommand."""
    names = raw_reply(client, "COMMAND", "LIST", "FILTERBY", "MODULE", "shard")
    out = []

    def walk(entry):
        name, arity, flags, categories = entry[0], entry[1], entry[2], entry[6]
        out.append((name.decode().lower(), arity, {f.decode() for f in flags},
                    {c.decode() for c in categories}))
        for sub in entry[9] if len(entry) > 9 else []:
            walk(sub)
    for entry in raw_reply(client, "COMMAND", "INFO", *names):
        walk(entry)
    return out


def admin_commands(client):
    """Whatever changes rings, runs or stops a job, debugs, or moves the generator: every
    command or subcommand flagged admin, and SHARD.ADVANCE (internal)."""
    found = [(n, a) for n, a, flags, _ in command_entries(client)
             if "admin" in flags or n == "shard.advance"]
    names = {n for n, _ in found}
    # The table really is read: these must be among them.
    assert {"shard.ring|set", "shard.ring|begin", "shard.ring|commit", "shard.ring|abort",
            "shard.reshard|copy", "shard.reshard|cleanup", "shard.reshard|stop",
            "shard.advance", "shard.debug"} <= names, names
    return found


def argv_for(name, arity):
    """The command's words padded with placeholders to a valid arity: the ACL check comes
    after the arity check and before the command runs, so placeholders are enough."""
    words = name.split("|")
    return words + ["x"] * max(0, abs(arity) - len(words))


def test_application_recipe_reaches_no_admin_command(fleet):
    app = as_user(fleet, "app", "app-pw")
    for name, arity in admin_commands(fleet.client()):
        with pytest.raises(redis.exceptions.NoPermissionError):
            app.execute_command(*argv_for(name, arity))
    # ... and the recipe still does its job.
    assert app.execute_command("SHARD.GENKEY")


def test_read_only_recipe_reaches_no_admin_command(fleet):
    reader = as_user(fleet, "reader", "reader-pw")
    for name, arity in admin_commands(fleet.client()):
        with pytest.raises(redis.exceptions.NoPermissionError):
            reader.execute_command(*argv_for(name, arity))


CATEGORIES = {
    "shard.genkey": {"write", "fast"},
    "shard.decode": {"read", "fast"},
    "shard.encode": {"read", "fast"},
    "shard.whereis": {"read", "fast"},
    "shard.locate": {"read", "fast"},
    "shard.hotkeys": {"keyspace", "read", "slow"},
    "shard.ring|get": {"read", "fast"},
    "shard.reshard|status": {"read", "fast"},
    "shard.specialkey": {"read", "fast"},
    "shard.retype": {"read", "fast"},
    "shard.minify": {"read", "fast"},
    "shard.maxify": {"read", "fast"},
    "shard.cluster": {"connection", "slow"},
    "shard.redirect": {"read", "write", "slow"},
    "shard.emulate": {"slow"},
    "shard.info": {"slow", "dangerous"},
    "shard.dump": {"read", "slow"},
}


def test_command_categories_as_the_readme_says(server):
    c = server.client()
    entries = command_entries(c)
    if not MODULE_ACL_CATEGORIES:
        # Redis 7.0 has no RedisModule_SetCommandACLCategories: module commands are in no
        # category, so the README's recipes grant them by name.
        assert all(not cats for _, _, _, cats in entries), entries
        return
    admin = {n for n, _ in admin_commands(c)}
    for name, _, _, cats in entries:
        cats = {x.lstrip("@") for x in cats}
        if name in admin:
            assert cats == {"admin", "dangerous", "slow"}, (name, cats)
        elif name in CATEGORIES:
            assert cats == CATEGORIES[name], (name, cats)
    listed = {x.decode().lower() for x in raw_reply(c, "ACL", "CAT", "dangerous")}
    assert admin <= listed, admin - listed


COMMON_RULES = [
    ("readwrite", "+@read +@write +@connection"),
    ("all-but-admin", "+@all -@admin"),
    ("all-but-dangerous", "+@all -@dangerous"),
    ("fast", "+@fast +@connection"),
]


@pytest.mark.skipif(not MODULE_ACL_CATEGORIES, reason=(
    "Redis 7.0 gives module commands no ACL categories: a category rule neither grants nor "
    "denies them (test_command_categories_as_the_readme_says pins that); grant by name there"))
@pytest.mark.parametrize("rule", [r for _, r in COMMON_RULES], ids=[n for n, _ in COMMON_RULES])
def test_common_category_rules_never_reach_admin_commands(fleet, rule):
    admin = fleet.client()
    admin.execute_command("ACL", "SETUSER", "u", "reset", "on", ">u-pw", "~*", "&*", *rule.split())
    u = as_user(fleet, "u", "u-pw")
    for name, arity in admin_commands(admin):
        with pytest.raises(redis.exceptions.NoPermissionError):
            u.execute_command(*argv_for(name, arity))
    # The categories still grant what they should: generation is a write, lookups reads.
    if "@write" in rule or "@all" in rule:
        assert u.execute_command("SHARD.GENKEY")
    if "@read" in rule or "@all" in rule or "@fast" in rule:
        assert u.execute_command("SHARD.WHEREIS", "k") == b"a"

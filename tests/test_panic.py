"""A panic inside a command becomes an ERR reply and a log line; the server goes on."""

import pytest
import redis


def test_panic_is_caught_logged_and_the_server_goes_on(server_factory):
    s = server_factory(config=[("enable-debug-command", "yes")])
    c = s.client()
    c.set("before", "intact")
    with pytest.raises(redis.ResponseError, match="internal error in shard.debug"):
        c.execute_command("SHARD.DEBUG", "PANIC")
    assert c.ping() and s.alive()
    assert c.get("before") == b"intact"
    assert c.execute_command("SHARD.GENKEY").isdigit()
    log = s.log()
    assert "shard: panic at src/commands/debug.rs" in log
    assert "SHARD.DEBUG PANIC was called" in log


def test_debug_is_refused_without_enable_debug_command(r):
    with pytest.raises(redis.ResponseError, match="SHARD.DEBUG is disabled"):
        r.execute_command("SHARD.DEBUG", "PANIC")

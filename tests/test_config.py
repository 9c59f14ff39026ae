"""Module configurations: loadmodule arguments, redis.conf lines, CONFIG SET/GET; INFO shard."""

import pytest
import redis

from helpers.server import RedisServer, ServerFailed, info_shard


def test_defaults_are_visible_in_config_get(r):
    got = r.config_get("shard.*")
    assert got == {
        "shard.layout": "snowflake", "shard.node-id": "0", "shard.epoch": "",
        "shard.custom-layout": "", "shard.encoding": "decimal", "shard.types": "",
        "shard.node-count": "1", "shard.max-drift-ms": "5000", "shard.node-bits": "10",
        "shard.ring-file": "",
        "shard.ring-algo": "ketama", "shard.ring-hashtag": "", "shard.self": "",
        "shard.auth-user": "", "shard.auth-password": "", "shard.call-timeout-ms": "1000",
        "shard.cluster-protocol": "no", "shard.key-index": "no", "shard.route-plain": "no",
        "shard.atomic-mset": "no", "shard.copy-fork": "auto", "shard.special-keys": "",
        "shard.fields": "",
        "shard.big-key-bytes": "1048576", "shard.big-key-elements": "4096",
        "shard.sentinels": "", "shard.sentinel-user": "", "shard.sentinel-password": "",
        "shard.read-from": "primary", "shard.topology-refresh-ms": "1000",
        "shard.fleet-lease-ms": "10000", "shard.txn-lock-ms": "5000",
        "shard.tls": "no", "shard.tls-cert-file": "", "shard.tls-key-file": "",
        "shard.tls-ca-cert-file": "", "shard.tls-ca-cert-dir": "", "shard.tls-server-name": "",
    }


@pytest.mark.parametrize(
    "name,value,message",
    [
        ("shard.read-from", "replicas", "shard.read-from must be primary, replica or replica-preferred, got 'replicas'"),
        ("shard.sentinels", "127.0.0.1:26379 nope", "shard.sentinels: 'nope' is not host:port"),
        ("shard.sentinels", "127.0.0.1:0", "shard.sentinels: '127.0.0.1:0' is not host:port"),
    ],
)
def test_high_availability_settings_are_checked(r, name, value, message):
    with pytest.raises(redis.ResponseError, match=message):
        r.config_set(name, value)
    # Nothing changed.
    assert r.config_get(name)[name] in ("", "primary")


def test_sentinel_password_never_shows_in_info_or_the_ring(r):
    r.config_set("shard.sentinel-password", "s3cret")
    r.execute_command("SHARD.RING", "SET", "ketama", "n0", "sentinel", 1)
    assert "s3cret" not in str(r.info("shard"))
    assert "s3cret" not in str(r.execute_command("SHARD.RING", "GET"))


def test_module_arguments_set_configuration(server_factory):
    c = server_factory(module_args=["layout", "sonyflake", "node-id", 40000, "max-drift-ms", 100]).client()
    assert c.config_get("shard.layout") == {"shard.layout": "sonyflake"}
    assert c.config_get("shard.node-id") == {"shard.node-id": "40000"}
    assert int(c.execute_command("SHARD.GENKEY")) & 0xFFFF == 40000


def test_redis_conf_lines_set_configuration(server_factory):
    c = server_factory(config=[("shard.layout", "instagram"), ("shard.node-id", 77)]).client()
    key = int(c.execute_command("SHARD.GENKEY"))
    assert (key >> 10) & 8191 == 77
    assert info_shard(c)["layout"] == "instagram"


@pytest.mark.parametrize(
    "args,message",
    [
        (["node-id", 1024], "node-id 1024 does not fit layout snowflake"),
        (["layout", "uuid"], "unknown layout 'uuid'"),
        (["nodeid", 3], "unknown module argument 'nodeid'"),
        (["node-id"], "name value pairs"),
        (["layout", "custom"], "layout custom needs custom-layout"),
        (["layout", "custom", "custom-layout", "time:41 node:10 seq:13"], "64 bits in all; at most 63"),
        (["encoding", "hex"], "unknown encoding 'hex'"),
        (["epoch", "yesterday"], "epoch must be unix milliseconds"),
        (["types", "user"], "'user' is not name:number"),
    ],
)
def test_bad_load_configuration_stops_the_load_with_a_message(tmp_path, args, message):
    s = RedisServer(tmp_path / "bad", module_args=args)
    with pytest.raises(ServerFailed) as e:
        s.start()
    s.stop()
    assert message in str(e.value)


def test_config_set_checks_the_combination_and_keeps_the_old_value(r):
    with pytest.raises(redis.ResponseError, match="node-id 2000 does not fit layout snowflake"):
        r.config_set("shard.node-id", 2000)
    assert r.config_get("shard.node-id") == {"shard.node-id": "0"}
    with pytest.raises(redis.ResponseError, match="unknown layout"):
        r.config_set("shard.layout", "nope")
    assert r.config_get("shard.layout") == {"shard.layout": "snowflake"}
    with pytest.raises(redis.ResponseError, match="invalid custom layout"):
        r.config_set("shard.custom-layout", "seq:12 time:41")
    with pytest.raises(redis.ResponseError):
        r.config_set("shard.max-drift-ms", -1)
    # Changing the layout first, then the node id, works.
    r.config_set("shard.layout", "sonyflake")
    r.config_set("shard.node-id", 2000)
    assert int(r.execute_command("SHARD.GENKEY")) & 0xFFFF == 2000
    with pytest.raises(redis.ResponseError, match="node-id 2000 does not fit layout snowflake"):
        r.config_set("shard.layout", "snowflake")


def test_layout_change_never_goes_back_in_time(r):
    keys = r.execute_command("SHARD.GENKEY", "COUNT", 100000)  # borrows ~24 ms ahead
    last = r.execute_command("SHARD.DECODE", keys[-1])
    last_ms = dict(zip(last[::2], last[1::2]))[b"time_ms"]
    r.config_set("shard.layout", "instagram")
    first = r.execute_command("SHARD.DECODE", r.execute_command("SHARD.GENKEY"))
    assert dict(zip(first[::2], first[1::2]))[b"time_ms"] > last_ms


def test_info_shard_fields(server_factory):
    c = server_factory(module_args=["node-id", 12]).client()
    c.execute_command("SHARD.GENKEY", "COUNT", 10000)
    info = info_shard(c)
    assert info["layout"] == "snowflake"
    assert info["node_id"] == "12"
    assert info["epoch_ms"] == "1288834974657"
    assert info["encoding"] == "decimal"
    assert info["keys_generated"] == "10000"
    assert int(info["ticks_borrowed"]) >= 2
    assert info["clock_backsteps"] == "0"
    assert info["genkey_refused"] == "0"
    assert 0 <= int(info["drift_ms"]) <= 5000
    assert info["max_drift_ms"] == "5000"
    assert int(info["high_water_ms"]) > 1288834974657
    # The section also shows in a plain INFO.
    assert c.info("everything")["shard_keys_generated"] == 10000

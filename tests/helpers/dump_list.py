"""A list read from its `DUMP` payload (`SHARD.DUMP key`, which the cluster protocol's filter
lets through on any node): the nemesis test's report and observer read each server's own copy
of a list this way, where a plain `LRANGE` (or one in a script) would be redirected to the
key's owner. Understands the payloads of Redis 7.0 and Valkey 9.1 for lists: a quicklist of
listpacks or plain nodes (RDB type 18), LZF-compressed strings included."""


def _length(data, i):
    """An RDB length at `i`: (value, next index, special encoding or None)."""
    b = data[i]
    kind = b >> 6
    if kind == 0:
        return b & 0x3F, i + 1, None
    if kind == 1:
        return ((b & 0x3F) << 8) | data[i + 1], i + 2, None
    if kind == 2:
        if b == 0x80:
            return int.from_bytes(data[i + 1:i + 5], "big"), i + 5, None
        return int.from_bytes(data[i + 1:i + 9], "big"), i + 9, None
    return b & 0x3F, i + 1, b & 0x3F


def _lzf(data, size):
    out = bytearray()
    i = 0
    while i < len(data):
        ctrl = data[i]
        i += 1
        if ctrl < 32:
            out += data[i:i + ctrl + 1]
            i += ctrl + 1
            continue
        n = ctrl >> 5
        ref = len(out) - ((ctrl & 0x1F) << 8) - 1
        if n == 7:
            n += data[i]
            i += 1
        ref -= data[i]
        i += 1
        for _ in range(n + 2):
            out.append(out[ref])
            ref += 1
    return bytes(out[:size])


def _string(data, i):
    n, i, special = _length(data, i)
    if special is None:
        return data[i:i + n], i + n
    if special in (0, 1, 2):
        width = 1 << special
        v = int.from_bytes(data[i:i + width], "little", signed=True)
        return str(v).encode(), i + width
    clen, i, _ = _length(data, i)
    size, i, _ = _length(data, i)
    return _lzf(data[i:i + clen], size), i + clen


def _listpack(lp):
    out = []
    p = 6
    while p < len(lp) and lp[p] != 0xFF:
        b = lp[p]
        if b & 0x80 == 0:
            value, size = str(b & 0x7F).encode(), 1
        elif b & 0xC0 == 0x80:
            n = b & 0x3F
            value, size = lp[p + 1:p + 1 + n], 1 + n
        elif b & 0xE0 == 0xC0:
            v = ((b & 0x1F) << 8) | lp[p + 1]
            value, size = str(v - (1 << 13) if v >= 1 << 12 else v).encode(), 2
        elif b & 0xF0 == 0xE0:
            n = ((b & 0x0F) << 8) | lp[p + 1]
            value, size = lp[p + 2:p + 2 + n], 2 + n
        elif b == 0xF0:
            n = int.from_bytes(lp[p + 1:p + 5], "little")
            value, size = lp[p + 5:p + 5 + n], 5 + n
        else:
            width = {0xF1: 2, 0xF2: 3, 0xF3: 4, 0xF4: 8}[b]
            v = int.from_bytes(lp[p + 1:p + 1 + width], "little", signed=True)
            value, size = str(v).encode(), 1 + width
        out.append(value)
        back = 1 if size <= 127 else 2 if size < 16383 else 3 if size < 2097151 else \
            4 if size < 268435455 else 5
        p += size + back
    return out


def list_elements(payload):
    """The elements (str) of the list whose `DUMP` payload this is; None for another type."""
    if not payload or payload[0] != 18:
        return None
    nodes, i, _ = _length(payload, 1)
    out = []
    for _ in range(nodes):
        container, i, _ = _length(payload, i)
        blob, i = _string(payload, i)
        out += [blob] if container == 1 else _listpack(blob)
    return [e.decode(errors="replace") for e in out]


def read_list(client, key):
    """`key`'s list as the server of `client` holds it ([] when it has none)."""
    reply = client.execute_command("SHARD.DUMP", key)
    if not reply:
        return []
    payload = reply[0] if isinstance(reply, list) else reply
    got = list_elements(payload)
    if got is None:
        raise ValueError(f"{key}: not a list payload (type {payload[:1]!r})")
    return got

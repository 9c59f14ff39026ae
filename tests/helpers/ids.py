"""The keys SHARD.GENKEY issues, read the way the tests need them, for the layouts whose
guarantees the durability and ID tests check on each: `snowflake` (the default), `tsid`,
`uuidv7` and `ulid` (issue 34).

`Ids(layout).value(key)` is the number a key holds: its text order is the number's order for
every form these layouts write (fixed-width decimal aside, which only snowflake's is, and
snowflake's decimal keys are compared as numbers), so the tests compare values. `ms(value)` is
the key's unix millisecond and `node(value)` its node id, with the layout's bits as
src/keys/uuidv7.rs, ulid.rs and tsid.rs lay them out (node-bits 10 unless told).
"""

SNOWFLAKE_EPOCH = 1288834974657
TSID_EPOCH = 1577836800000
CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
LAYOUTS = ["snowflake", "tsid", "uuidv7", "ulid"]
NEW_LAYOUTS = ["tsid", "uuidv7", "ulid"]


def crockford(text):
    """The number a Crockford base32 text holds (either case, the alphabet only)."""
    text = text.decode() if isinstance(text, bytes) else text
    n = 0
    for c in text.upper():
        n = n * 32 + CROCKFORD.index(c)
    return n


def to_crockford(n, width):
    return "".join(CROCKFORD[(n >> (5 * i)) & 31] for i in reversed(range(width)))


def uuid_text(n):
    h = f"{n:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


class Ids:
    """How the keys of one layout are read."""

    def __init__(self, layout, node_bits=10):
        self.layout = layout
        self.node_bits = node_bits
        self.node_mask = (1 << node_bits) - 1

    def __repr__(self):
        return f"Ids({self.layout!r})"

    def module_args(self):
        return [] if self.layout == "snowflake" else ["layout", self.layout]

    def value(self, key):
        key = key if isinstance(key, bytes) else str(key).encode()
        if self.layout == "snowflake":
            return int(key)
        if self.layout == "uuidv7":
            assert len(key) == 36, key
            return int(key.replace(b"-", b""), 16)
        if self.layout == "ulid":
            assert len(key) == 26, key
            return crockford(key)
        assert self.layout == "tsid" and len(key) == 13, key
        return crockford(key)

    def ms(self, value):
        if self.layout == "snowflake":
            return (value >> 22) + SNOWFLAKE_EPOCH
        if self.layout == "tsid":
            return (value >> 22) + TSID_EPOCH
        return value >> 80

    def node(self, value):
        if self.layout == "snowflake":
            return (value >> 12) & 1023
        if self.layout == "tsid":
            return (value >> (22 - self.node_bits)) & self.node_mask
        if self.layout == "uuidv7":
            return (value >> (50 - self.node_bits)) & self.node_mask
        return (value >> (80 - self.node_bits)) & self.node_mask

    def version_and_variant(self, value):
        """(version, variant bits) of a UUID value."""
        return (value >> 76) & 0xF, (value >> 62) & 0b11

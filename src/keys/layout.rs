//! Key layouts: which fields a key holds, how wide each is, the epoch and the time unit.
//!
//! A bit layout packs `time`, `node`, `type` and `seq` into at most 63 bits, most significant
//! first, with `time` always on top so that keys sort by time. The Shardjs layout is text:
//! unpadded base62 time, two base62 characters of variant (our `seq`) and two of type; its
//! node is not stored but implied by the time modulo the number of nodes (Shardjs's virtual
//! shard). The layouts and their epochs are those of ../shared/PEERS.md.
//!
//! The time-sorted IDs of other specifications live in files of their own: `tsid` (a 64-bit
//! bit layout built here), `wide` with `uuidv7` and `ulid` (128 bits, `Form::Wide`).

use std::fmt;

use super::wide::WideForm;

/// The named layouts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayoutKind {
    Snowflake,
    Instagram,
    Sonyflake,
    Shardjs,
    Custom,
    Tsid,
    Uuidv7,
    Ulid,
}

impl LayoutKind {
    pub const ALL: [LayoutKind; 8] = [
        LayoutKind::Snowflake,
        LayoutKind::Instagram,
        LayoutKind::Sonyflake,
        LayoutKind::Shardjs,
        LayoutKind::Custom,
        LayoutKind::Tsid,
        LayoutKind::Uuidv7,
        LayoutKind::Ulid,
    ];

    /// Parses a layout name, case-insensitively.
    pub fn parse(name: &[u8]) -> Result<LayoutKind, LayoutError> {
        Self::ALL
            .into_iter()
            .find(|k| k.name().as_bytes().eq_ignore_ascii_case(name))
            .ok_or_else(|| LayoutError::UnknownLayout(String::from_utf8_lossy(name).into_owned()))
    }

    pub fn name(self) -> &'static str {
        match self {
            LayoutKind::Snowflake => "snowflake",
            LayoutKind::Instagram => "instagram",
            LayoutKind::Sonyflake => "sonyflake",
            LayoutKind::Shardjs => "shardjs",
            LayoutKind::Custom => "custom",
            LayoutKind::Tsid => "tsid",
            LayoutKind::Uuidv7 => "uuidv7",
            LayoutKind::Ulid => "ulid",
        }
    }

    /// The epoch (unix ms) the layout's own system uses; custom layouts take Twitter's; UUIDv7
    /// and ULID count from 1970.
    pub fn default_epoch_ms(self) -> i64 {
        match self {
            LayoutKind::Snowflake | LayoutKind::Custom => 1_288_834_974_657,
            LayoutKind::Instagram => 1_314_220_021_721,
            LayoutKind::Sonyflake => 1_409_529_600_000,
            LayoutKind::Shardjs => 1_325_404_800_000,
            LayoutKind::Tsid => 1_577_836_800_000,
            LayoutKind::Uuidv7 | LayoutKind::Ulid => 0,
        }
    }
}

/// One field of a bit layout: `bits` wide, starting `shift` bits from the least significant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BitField {
    pub bits: u32,
    pub shift: u32,
}

impl BitField {
    /// The largest value the field holds (0 for a field of no bits).
    #[inline]
    pub fn max(self) -> u64 {
        if self.bits == 0 {
            0
        } else {
            u64::MAX >> (64 - self.bits)
        }
    }

    #[inline]
    fn get(self, key: u64) -> u64 {
        if self.bits == 0 {
            0
        } else {
            (key >> self.shift) & self.max()
        }
    }

    #[inline]
    fn put(self, value: u64) -> u64 {
        if self.bits == 0 {
            0
        } else {
            value << self.shift
        }
    }
}

/// How a layout stores its fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Form {
    /// A 63-bit integer.
    Bits {
        time: BitField,
        node: BitField,
        key_type: BitField,
        seq: BitField,
    },
    /// Shardjs text: base62 time, 2-character variant, 2-character type.
    Shardjs { node_count: u64 },
    /// 128 bits: UUIDv7 or ULID (`wide`).
    Wide(WideForm),
}

/// Shardjs's variant and type are two base62 characters: 0..=3843.
pub const SHARDJS_FIELD_MAX: u64 = 62 * 62 - 1;
/// Shardjs's default key type.
pub const SHARDJS_DEFAULT_TYPE: u64 = SHARDJS_FIELD_MAX;
/// Upper bound of a Shardjs time offset (nine base62 characters, about 428 000 years).
const SHARDJS_MAX_TICK: u64 = 13_537_086_546_263_551; // 62^9 - 1
/// Upper bound of the time unit of a custom layout: one day.
const MAX_UNIT_MS: u64 = 86_400_000;

/// The fields of one key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct KeyFields {
    /// Time ticks since the epoch.
    pub tick: u64,
    pub node: u64,
    pub key_type: u64,
    pub seq: u64,
}

/// A resolved layout: kind, form, epoch and unit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub kind: LayoutKind,
    pub form: Form,
    pub epoch_ms: i64,
    pub unit_ms: u64,
}

/// What is wrong with a layout, its description, or a key for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LayoutError {
    UnknownLayout(String),
    CustomSpec(String),
    FieldRange {
        field: &'static str,
        value: u64,
        max: u64,
    },
    BeforeEpoch {
        time_ms: i64,
        epoch_ms: i64,
    },
    TimeNotOnNode {
        node: u64,
        node_count: u64,
    },
}

impl fmt::Display for LayoutError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LayoutError::UnknownLayout(name) => write!(
                f,
                "unknown layout '{name}': expected snowflake, instagram, sonyflake, shardjs, custom, \
                 tsid, uuidv7 or ulid"
            ),
            LayoutError::CustomSpec(msg) => write!(f, "invalid custom layout: {msg}"),
            LayoutError::FieldRange { field, value, max } => {
                write!(f, "{field} {value} is out of range for this layout (0 to {max})")
            }
            LayoutError::BeforeEpoch { time_ms, epoch_ms } => {
                write!(f, "time {time_ms} is before the layout's epoch {epoch_ms}")
            }
            LayoutError::TimeNotOnNode { node, node_count } => write!(
                f,
                "in the shardjs layout the node is the time offset modulo node-count {node_count}; \
                 this time belongs to node {node}"
            ),
        }
    }
}

impl Layout {
    /// Twitter's snowflake: 41 time, 10 node, 12 seq, 1 ms.
    pub fn snowflake() -> Layout {
        Self::from_fields(
            LayoutKind::Snowflake,
            &[(Field::Time, 41), (Field::Node, 10), (Field::Seq, 12)],
            1,
        )
    }

    /// Instagram: 41 time, 13 shard, 10 seq, 1 ms.
    pub fn instagram() -> Layout {
        Self::from_fields(
            LayoutKind::Instagram,
            &[(Field::Time, 41), (Field::Node, 13), (Field::Seq, 10)],
            1,
        )
    }

    /// Sonyflake v1: 39 time, 8 seq, 16 machine, 10 ms.
    pub fn sonyflake() -> Layout {
        Self::from_fields(
            LayoutKind::Sonyflake,
            &[(Field::Time, 39), (Field::Seq, 8), (Field::Node, 16)],
            10,
        )
    }

    /// Shardjs text keys, with `node_count` generating nodes (at least 1).
    pub fn shardjs(node_count: u64) -> Layout {
        Layout {
            kind: LayoutKind::Shardjs,
            form: Form::Shardjs {
                node_count: node_count.max(1),
            },
            epoch_ms: LayoutKind::Shardjs.default_epoch_ms(),
            unit_ms: 1,
        }
    }

    /// Parses a custom layout, e.g. `time:41 node:10 type:0 seq:12 unit:1`.
    ///
    /// Fields are listed most significant first; `time` must come first and `seq` must be
    /// present; `node` and `type` may be left out (0 bits); `unit` (ms per tick) defaults to 1.
    pub fn custom(spec: &str) -> Result<Layout, LayoutError> {
        let bad = |msg: String| LayoutError::CustomSpec(msg);
        let mut fields: Vec<(Field, u32)> = Vec::with_capacity(4);
        let mut unit: Option<u64> = None;
        for item in spec.split_whitespace() {
            let (name, value) = item
                .split_once(':')
                .ok_or_else(|| bad(format!("'{item}' is not name:value")))?;
            if name == "unit" {
                if unit.is_some() {
                    return Err(bad("unit is given twice".into()));
                }
                let u = value
                    .parse::<u64>()
                    .ok()
                    .filter(|u| (1..=MAX_UNIT_MS).contains(u))
                    .ok_or_else(|| {
                        bad(format!("unit must be 1 to {MAX_UNIT_MS} ms, got '{value}'"))
                    })?;
                unit = Some(u);
                continue;
            }
            let field = Field::parse(name).ok_or_else(|| {
                bad(format!(
                    "unknown field '{name}': expected time, node, type, seq or unit"
                ))
            })?;
            if fields.iter().any(|(f, _)| *f == field) {
                return Err(bad(format!("field '{name}' is given twice")));
            }
            let bits = value
                .parse::<u32>()
                .ok()
                .filter(|b| *b <= 63)
                .ok_or_else(|| bad(format!("{name} width must be 0 to 63 bits, got '{value}'")))?;
            fields.push((field, bits));
        }
        match fields.first() {
            None => return Err(bad("no fields given".into())),
            Some((Field::Time, 0)) => return Err(bad("time needs at least 1 bit".into())),
            Some((Field::Time, _)) => {}
            Some(_) => return Err(bad("time must be the first (most significant) field".into())),
        }
        if !fields.iter().any(|(f, _)| *f == Field::Seq) {
            return Err(bad("a seq field is required".into()));
        }
        let total: u32 = fields.iter().map(|(_, b)| b).sum();
        if total > 63 {
            return Err(bad(format!("{total} bits in all; at most 63 are allowed")));
        }
        Ok(Self::from_fields(
            LayoutKind::Custom,
            &fields,
            unit.unwrap_or(1),
        ))
    }

    /// Builds a bit layout from fields listed most significant first.
    pub(super) fn from_fields(kind: LayoutKind, fields: &[(Field, u32)], unit_ms: u64) -> Layout {
        let mut shift: u32 = fields.iter().map(|(_, b)| b).sum();
        let (mut time, mut node, mut key_type, mut seq) = Default::default();
        for &(field, bits) in fields {
            shift -= bits;
            let bf = BitField {
                bits,
                shift: if bits == 0 { 0 } else { shift },
            };
            match field {
                Field::Time => time = bf,
                Field::Node => node = bf,
                Field::Type => key_type = bf,
                Field::Seq => seq = bf,
            }
        }
        Layout {
            kind,
            form: Form::Bits {
                time,
                node,
                key_type,
                seq,
            },
            epoch_ms: kind.default_epoch_ms(),
            unit_ms,
        }
    }

    /// The same layout with another epoch.
    pub fn with_epoch(mut self, epoch_ms: i64) -> Layout {
        self.epoch_ms = epoch_ms;
        self
    }

    pub fn name(&self) -> &'static str {
        self.kind.name()
    }

    pub fn is_text(&self) -> bool {
        matches!(self.form, Form::Shardjs { .. })
    }

    pub fn max_tick(&self) -> u64 {
        match self.form {
            Form::Bits { time, .. } => time.max(),
            Form::Shardjs { .. } => SHARDJS_MAX_TICK,
            Form::Wide(_) => WideForm::MAX_MS,
        }
    }

    pub fn max_seq(&self) -> u64 {
        match self.form {
            Form::Bits { seq, .. } => seq.max(),
            Form::Shardjs { .. } => SHARDJS_FIELD_MAX,
            Form::Wide(w) => w.max_seq(),
        }
    }

    /// The largest node number, or for Shardjs `node_count - 1`.
    pub fn max_node(&self) -> u64 {
        match self.form {
            Form::Bits { node, .. } => node.max(),
            Form::Shardjs { node_count } => node_count - 1,
            Form::Wide(w) => w.max_node(),
        }
    }

    /// The largest type number, or `None` when the layout has no type field.
    pub fn max_type(&self) -> Option<u64> {
        match self.form {
            Form::Bits { key_type, .. } if key_type.bits == 0 => None,
            Form::Bits { key_type, .. } => Some(key_type.max()),
            Form::Shardjs { .. } => Some(SHARDJS_FIELD_MAX),
            Form::Wide(_) => None,
        }
    }

    /// The type a key gets when none is asked for.
    pub fn default_type(&self) -> u64 {
        match self.form {
            Form::Bits { .. } | Form::Wide(_) => 0,
            Form::Shardjs { .. } => SHARDJS_DEFAULT_TYPE,
        }
    }

    /// True when the type field is more significant than the sequence, so that within one
    /// tick a smaller type after a larger one would sort lower.
    pub fn type_above_seq(&self) -> bool {
        match self.form {
            Form::Bits { key_type, seq, .. } => key_type.bits > 0 && key_type.shift > seq.shift,
            Form::Shardjs { .. } | Form::Wide(_) => false,
        }
    }

    /// Ticks one node may use: those `t` with `t % stride == offset`.
    /// Every tick for bit layouts; Shardjs's virtual shard for node `node_id`.
    pub fn tick_stride(&self, node_id: u64) -> (u64, u64) {
        match self.form {
            Form::Bits { .. } | Form::Wide(_) => (1, 0),
            Form::Shardjs { node_count } => (node_count, node_id % node_count),
        }
    }

    /// Unix ms at the start of `tick`, saturating.
    pub fn time_ms(&self, tick: u64) -> i64 {
        let offset = i64::try_from(tick.saturating_mul(self.unit_ms)).unwrap_or(i64::MAX);
        self.epoch_ms.saturating_add(offset)
    }

    /// The tick holding unix ms `ms`; an error when it is before the epoch or past the layout.
    pub fn tick_of(&self, ms: i64) -> Result<u64, LayoutError> {
        let since =
            ms.checked_sub(self.epoch_ms)
                .filter(|d| *d >= 0)
                .ok_or(LayoutError::BeforeEpoch {
                    time_ms: ms,
                    epoch_ms: self.epoch_ms,
                })?;
        // Millisecond layouts skip the division: a 64-bit `div` is a large part of a GENKEY.
        let tick = match self.unit_ms {
            1 => since as u64,
            unit => since as u64 / unit,
        };
        self.check("time ticks", tick, self.max_tick())?;
        Ok(tick)
    }

    /// The node a key of these fields belongs to (Shardjs: derived from the time).
    pub fn node_of(&self, fields: &KeyFields) -> u64 {
        match self.form {
            Form::Bits { .. } | Form::Wide(_) => fields.node,
            Form::Shardjs { node_count } => fields.tick % node_count,
        }
    }

    fn check(&self, field: &'static str, value: u64, max: u64) -> Result<(), LayoutError> {
        if value > max {
            Err(LayoutError::FieldRange { field, value, max })
        } else {
            Ok(())
        }
    }

    /// Checks that every field fits (the inverse of `unpack`'s guarantees).
    pub fn validate(&self, fields: &KeyFields) -> Result<(), LayoutError> {
        self.check("time ticks", fields.tick, self.max_tick())?;
        self.check("seq", fields.seq, self.max_seq())?;
        match self.form {
            Form::Bits { node, .. } => self.check("node", fields.node, node.max())?,
            Form::Wide(w) => self.check("node", fields.node, w.max_node())?,
            Form::Shardjs { node_count } => {
                let implied = fields.tick % node_count;
                if fields.node != implied {
                    return Err(LayoutError::TimeNotOnNode {
                        node: implied,
                        node_count,
                    });
                }
            }
        }
        match self.max_type() {
            Some(max) => self.check("type", fields.key_type, max),
            None => self.check("type", fields.key_type, 0),
        }
    }

    /// Packs fields that `validate` accepted into the 63-bit number of a bit layout.
    /// For Shardjs, the same order as its text: time, then variant, then type. A 128-bit layout
    /// has no such number (0): its IDs are made by `wide`.
    #[inline]
    pub fn pack(&self, f: &KeyFields) -> u64 {
        match self.form {
            Form::Bits {
                time,
                node,
                key_type,
                seq,
            } => time.put(f.tick) | node.put(f.node) | key_type.put(f.key_type) | seq.put(f.seq),
            Form::Shardjs { .. } => {
                let per_tick = (SHARDJS_FIELD_MAX + 1) * (SHARDJS_FIELD_MAX + 1);
                f.tick
                    .saturating_mul(per_tick)
                    .saturating_add(f.seq * (SHARDJS_FIELD_MAX + 1) + f.key_type)
            }
            Form::Wide(_) => 0,
        }
    }

    /// Splits the number of a bit layout into its fields; `None` for a number wider than the
    /// layout.
    pub fn unpack(&self, key: u64) -> Option<KeyFields> {
        match self.form {
            Form::Bits {
                time,
                node,
                key_type,
                seq,
            } => {
                let width = time.bits + node.bits + key_type.bits + seq.bits;
                if width < 64 && key >> width != 0 {
                    return None;
                }
                Some(KeyFields {
                    tick: time.get(key),
                    node: node.get(key),
                    key_type: key_type.get(key),
                    seq: seq.get(key),
                })
            }
            Form::Shardjs { .. } | Form::Wide(_) => None,
        }
    }
}

/// A field name of a bit layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Field {
    Time,
    Node,
    Type,
    Seq,
}

impl Field {
    fn parse(name: &str) -> Option<Field> {
        match name {
            "time" => Some(Field::Time),
            "node" => Some(Field::Node),
            "type" => Some(Field::Type),
            "seq" => Some(Field::Seq),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snowflake_packs_like_twitter() {
        let l = Layout::snowflake();
        // 1288834974657 + 1 ms, node 1, seq 0: (1 << 22) | (1 << 12)
        let f = KeyFields {
            tick: 1,
            node: 1,
            key_type: 0,
            seq: 0,
        };
        assert_eq!(l.pack(&f), (1 << 22) | (1 << 12));
        assert_eq!(l.unpack((1 << 22) | (1 << 12) | 7).unwrap().seq, 7);
        assert_eq!(l.max_seq(), 4095);
        assert_eq!(l.max_node(), 1023);
        assert_eq!(l.max_type(), None);
        assert!(
            l.unpack(1 << 63).is_none(),
            "64th bit is out of a 63-bit layout"
        );
    }

    #[test]
    fn instagram_and_sonyflake_fields() {
        let i = Layout::instagram();
        assert_eq!((i.max_node(), i.max_seq()), (8191, 1023));
        let s = Layout::sonyflake();
        assert_eq!((s.max_node(), s.max_seq(), s.unit_ms), (65535, 255, 10));
        // Sonyflake puts the machine id in the low 16 bits, the sequence above it.
        let f = KeyFields {
            tick: 3,
            node: 0xBEEF,
            key_type: 0,
            seq: 5,
        };
        assert_eq!(s.pack(&f), (3 << 24) | (5 << 16) | 0xBEEF);
        assert_eq!(s.unpack(s.pack(&f)), Some(f));
    }

    #[test]
    fn custom_layout_parses_in_order() {
        let l = Layout::custom("time:41 node:10 type:0 seq:12 unit:1").unwrap();
        assert_eq!(l.form, Layout::snowflake().form);
        let t = Layout::custom("time:40 type:4 node:6 seq:10 unit:10").unwrap();
        assert_eq!(t.max_type(), Some(15));
        assert!(t.type_above_seq());
        assert_eq!(t.unit_ms, 10);
        let f = KeyFields {
            tick: 9,
            node: 63,
            key_type: 15,
            seq: 1023,
        };
        assert_eq!(t.unpack(t.pack(&f)), Some(f));
        let low = Layout::custom("time:41 node:10 seq:8 type:4").unwrap();
        assert!(!low.type_above_seq());
    }

    #[test]
    fn custom_layout_errors_say_what_is_wrong() {
        let err = |s: &str| Layout::custom(s).unwrap_err().to_string();
        assert!(err("time:41 node:10 seq:13").contains("64 bits in all"));
        assert!(err("node:10 time:41 seq:12").contains("time must be the first"));
        assert!(err("time:41 node:10").contains("seq field is required"));
        assert!(err("time:41 seq:12 seq:1").contains("given twice"));
        assert!(err("time:41 color:3 seq:1").contains("unknown field 'color'"));
        assert!(err("time:41 seq:x").contains("seq width"));
        assert!(err("time:41 seq:12 unit:0").contains("unit must be"));
        assert!(err("time41").contains("not name:value"));
        assert!(err("").contains("no fields"));
        assert!(err("time:0 seq:12").contains("at least 1 bit"));
    }

    #[test]
    fn ticks_and_epochs() {
        let s = Layout::sonyflake();
        assert_eq!(s.tick_of(1_409_529_600_000 + 25).unwrap(), 2);
        assert_eq!(s.time_ms(2), 1_409_529_600_020);
        assert!(matches!(s.tick_of(0), Err(LayoutError::BeforeEpoch { .. })));
        let l = Layout::snowflake().with_epoch(0);
        assert!(l.tick_of(1 << 41).is_err(), "past the 41-bit time field");
    }

    #[test]
    fn shardjs_node_is_implied_by_time() {
        let l = Layout::shardjs(4);
        assert_eq!(l.tick_stride(3), (4, 3));
        let f = KeyFields {
            tick: 11,
            node: 3,
            key_type: 1,
            seq: 190,
        };
        assert!(l.validate(&f).is_ok());
        assert!(l.validate(&KeyFields { node: 2, ..f }).is_err());
        assert!(l.validate(&KeyFields { seq: 3844, ..f }).is_err());
        assert_eq!(l.default_type(), 3843);
        assert!(l.pack(&f) < l.pack(&KeyFields { seq: 191, ..f }));
        assert!(
            l.pack(&KeyFields { seq: 3843, ..f })
                < l.pack(&KeyFields {
                    tick: 12,
                    seq: 0,
                    ..f
                })
        );
    }

    #[test]
    fn layout_names_parse() {
        assert_eq!(
            LayoutKind::parse(b"Sonyflake").unwrap(),
            LayoutKind::Sonyflake
        );
        assert!(LayoutKind::parse(b"uuid")
            .unwrap_err()
            .to_string()
            .contains("unknown layout 'uuid'"));
    }
}

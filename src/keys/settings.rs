//! The generator's configuration, as set (`KeyConfig`) and as checked and resolved
//! (`KeySettings`). Resolving checks the combination: the node id must fit the layout's node
//! field, the type numbers its type field, and so on, so a bad value is refused whole.

use super::codec::Encoding;
use super::generator::Shape;
use super::layout::{Layout, LayoutKind};
use super::tsid::{self, DEFAULT_NODE_BITS};
use super::types::TypeNames;

/// Latest epoch accepted: the last millisecond of year 9999.
const MAX_EPOCH_MS: i64 = 253_402_300_799_999;

/// The configuration values as the user gave them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyConfig {
    pub layout: String,
    pub node_id: i64,
    /// Unix ms, or empty for the layout's own epoch.
    pub epoch: String,
    pub custom_layout: String,
    pub encoding: String,
    pub types: String,
    pub node_count: i64,
    pub max_drift_ms: i64,
    /// Bits of the node id in the tsid, uuidv7 and ulid layouts.
    pub node_bits: i64,
}

impl Default for KeyConfig {
    fn default() -> Self {
        KeyConfig {
            layout: "snowflake".into(),
            node_id: 0,
            epoch: String::new(),
            custom_layout: String::new(),
            encoding: "decimal".into(),
            types: String::new(),
            node_count: 1,
            max_drift_ms: 5000,
            node_bits: i64::from(DEFAULT_NODE_BITS),
        }
    }
}

/// The configuration, checked and ready for use.
#[derive(Debug, Clone)]
pub struct KeySettings {
    pub layout: Layout,
    pub node_id: u64,
    pub encoding: Encoding,
    pub types: TypeNames,
    pub max_drift_ms: i64,
    pub shape: Shape,
    /// The custom layout, when one is described (LAYOUT custom in DECODE/ENCODE uses it).
    custom: Option<Layout>,
    node_count: u64,
    node_bits: u32,
}

impl Default for KeySettings {
    /// The settings of the default configuration: snowflake, node 0, decimal.
    fn default() -> Self {
        let layout = Layout::snowflake();
        let defaults = KeyConfig::default();
        KeySettings {
            shape: Shape::of(&layout, 0),
            layout,
            node_id: 0,
            encoding: Encoding::Decimal,
            types: TypeNames::default(),
            max_drift_ms: defaults.max_drift_ms,
            custom: None,
            node_count: 1,
            node_bits: DEFAULT_NODE_BITS,
        }
    }
}

impl KeySettings {
    pub fn resolve(cfg: &KeyConfig) -> Result<KeySettings, String> {
        let kind = LayoutKind::parse(cfg.layout.as_bytes()).map_err(|e| e.to_string())?;
        let node_count = u64::try_from(cfg.node_count)
            .ok()
            .filter(|n| (1..=3844).contains(n))
            .ok_or_else(|| format!("node-count must be 1 to 3844, got {}", cfg.node_count))?;
        let custom = if cfg.custom_layout.trim().is_empty() {
            None
        } else {
            Some(Layout::custom(&cfg.custom_layout).map_err(|e| e.to_string())?)
        };
        let node_bits = u32::try_from(cfg.node_bits)
            .ok()
            .filter(|n| *n <= tsid::MAX_NODE_BITS)
            .ok_or_else(|| format!("node-bits must be 0 to 20, got {}", cfg.node_bits))?;
        let base = match kind {
            LayoutKind::Custom => custom.clone().ok_or_else(|| {
                "layout custom needs custom-layout, e.g. 'time:41 node:10 type:0 seq:12 unit:1'"
                    .to_string()
            })?,
            other => builtin(other, node_count, node_bits),
        };
        let layout = match parse_epoch(&cfg.epoch).map_err(|e| format!("epoch {e}"))? {
            Some(epoch) => with_epoch(base, epoch)?,
            None => base,
        };
        let node_id = u64::try_from(cfg.node_id).unwrap_or(u64::MAX);
        if node_id > layout.max_node() {
            let what = match layout.kind {
                LayoutKind::Shardjs => "node-count - 1",
                LayoutKind::Tsid | LayoutKind::Uuidv7 | LayoutKind::Ulid => "node-bits wide",
                _ => "its node field",
            };
            return Err(format!(
                "node-id {} does not fit layout {} (0 to {}, {what})",
                cfg.node_id,
                layout.name(),
                layout.max_node()
            ));
        }
        let encoding = Encoding::parse(cfg.encoding.as_bytes()).ok_or_else(|| {
            format!(
                "unknown encoding '{}': expected decimal or base62",
                cfg.encoding
            )
        })?;
        let types = TypeNames::parse(&cfg.types).map_err(|e| e.to_string())?;
        if let (Some(top), Some(max)) = (types.max_number(), layout.max_type()) {
            if top > max {
                return Err(format!(
                    "type number {top} does not fit layout {} (0 to {max})",
                    layout.name()
                ));
            }
        }
        if cfg.max_drift_ms < 0 {
            return Err(format!(
                "max-drift-ms must not be negative, got {}",
                cfg.max_drift_ms
            ));
        }
        let shape = Shape::of(&layout, node_id);
        Ok(KeySettings {
            layout,
            node_id,
            encoding,
            types,
            max_drift_ms: cfg.max_drift_ms,
            shape,
            custom,
            node_count,
            node_bits,
        })
    }

    /// The layout named by a LAYOUT option: the configured one when it is the same kind,
    /// otherwise that layout with its own default epoch; `epoch` overrides either.
    pub fn layout_for(&self, kind: LayoutKind, epoch: Option<i64>) -> Result<Layout, String> {
        let layout = if kind == self.layout.kind {
            self.layout.clone()
        } else if kind == LayoutKind::Custom {
            self.custom
                .clone()
                .ok_or("LAYOUT custom needs the custom-layout configuration to be set")?
        } else {
            builtin(kind, self.node_count, self.node_bits)
        };
        match epoch {
            Some(e) => with_epoch(layout, e),
            None => Ok(layout),
        }
    }

    /// A TYPE argument: a configured name, or a number that fits the layout's type field.
    pub fn type_number(&self, layout: &Layout, arg: &[u8]) -> Result<u64, String> {
        let max = layout.max_type().ok_or_else(|| {
            format!(
                "layout {} has no type field; TYPE needs a layout with one",
                layout.name()
            )
        })?;
        let number = match self.types.number_of(arg) {
            Some(n) => n,
            None => {
                let text = String::from_utf8_lossy(arg);
                text.parse::<u64>()
                    .ok()
                    .filter(|_| arg.iter().all(u8::is_ascii_digit))
                    .ok_or_else(|| {
                        format!(
                            "unknown type '{text}': expected a configured type name or a number"
                        )
                    })?
            }
        };
        if number > max {
            return Err(format!(
                "type {number} is out of range for layout {} (0 to {max})",
                layout.name()
            ));
        }
        Ok(number)
    }
}

fn builtin(kind: LayoutKind, node_count: u64, node_bits: u32) -> Layout {
    match kind {
        LayoutKind::Instagram => Layout::instagram(),
        LayoutKind::Sonyflake => Layout::sonyflake(),
        LayoutKind::Shardjs => Layout::shardjs(node_count),
        LayoutKind::Tsid => Layout::tsid(node_bits),
        LayoutKind::Uuidv7 => Layout::uuidv7(node_bits),
        LayoutKind::Ulid => Layout::ulid(node_bits),
        LayoutKind::Snowflake | LayoutKind::Custom => Layout::snowflake(),
    }
}

/// `layout` with another epoch; UUIDv7 and ULID count from 1970 by their specifications.
fn with_epoch(layout: Layout, epoch: i64) -> Result<Layout, String> {
    if layout.wide_form().is_some() && epoch != 0 {
        return Err(format!(
            "layout {} counts milliseconds from 1970 (its specification's epoch): epoch must be \
             empty (or 0) for it",
            layout.name()
        ));
    }
    Ok(layout.with_epoch(epoch))
}

/// An epoch in unix ms, or `None` for an empty text (the layout's own epoch). The error
/// completes a sentence that starts with the option's name.
pub fn parse_epoch(text: &str) -> Result<Option<i64>, String> {
    let text = text.trim();
    if text.is_empty() {
        return Ok(None);
    }
    text.parse::<i64>()
        .ok()
        .filter(|e| (0..=MAX_EPOCH_MS).contains(e))
        .map(Some)
        .ok_or_else(|| format!("must be unix milliseconds from 0 to {MAX_EPOCH_MS}, got '{text}'"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> KeyConfig {
        KeyConfig::default()
    }

    #[test]
    fn defaults_resolve_to_snowflake() {
        let s = KeySettings::resolve(&cfg()).unwrap();
        let d = KeySettings::default();
        assert_eq!(
            (d.layout.clone(), d.node_id, d.max_drift_ms),
            (s.layout.clone(), s.node_id, s.max_drift_ms)
        );
        assert_eq!(s.layout, Layout::snowflake());
        assert_eq!(
            (s.node_id, s.encoding, s.max_drift_ms),
            (0, Encoding::Decimal, 5000)
        );
    }

    #[test]
    fn node_id_is_checked_against_the_layout() {
        let mut c = cfg();
        c.node_id = 1024;
        assert!(KeySettings::resolve(&c)
            .unwrap_err()
            .contains("node-id 1024 does not fit layout snowflake (0 to 1023"));
        c.layout = "sonyflake".into();
        assert!(KeySettings::resolve(&c).is_ok());
        c.layout = "shardjs".into();
        c.node_count = 1025;
        assert!(KeySettings::resolve(&c).is_ok());
        c.node_count = 0;
        assert!(KeySettings::resolve(&c).unwrap_err().contains("node-count"));
        c.node_id = -1;
        c.node_count = 4;
        assert!(KeySettings::resolve(&c).is_err());
    }

    #[test]
    fn epoch_custom_types_and_encoding() {
        let mut c = cfg();
        c.epoch = "1000".into();
        assert_eq!(KeySettings::resolve(&c).unwrap().layout.epoch_ms, 1000);
        c.epoch = "soon".into();
        assert!(KeySettings::resolve(&c)
            .unwrap_err()
            .contains("epoch must be"));
        c.epoch = String::new();
        c.layout = "custom".into();
        assert!(KeySettings::resolve(&c)
            .unwrap_err()
            .contains("needs custom-layout"));
        c.custom_layout = "time:41 node:6 type:4 seq:12".into();
        c.types = "user:2 group:15".into();
        let s = KeySettings::resolve(&c).unwrap();
        assert_eq!(s.type_number(&s.layout, b"group").unwrap(), 15);
        assert_eq!(s.type_number(&s.layout, b"7").unwrap(), 7);
        assert!(s
            .type_number(&s.layout, b"16")
            .unwrap_err()
            .contains("out of range"));
        assert!(s
            .type_number(&s.layout, b"admin")
            .unwrap_err()
            .contains("unknown type 'admin'"));
        assert!(s.type_number(&s.layout, b"+7").is_err());
        c.types = "user:16".into();
        assert!(KeySettings::resolve(&c)
            .unwrap_err()
            .contains("does not fit"));
        c.types = String::new();
        c.encoding = "hex".into();
        assert!(KeySettings::resolve(&c)
            .unwrap_err()
            .contains("unknown encoding 'hex'"));
    }

    #[test]
    fn type_on_layout_without_type_field() {
        let s = KeySettings::resolve(&cfg()).unwrap();
        assert!(s
            .type_number(&s.layout, b"1")
            .unwrap_err()
            .contains("has no type field"));
    }

    #[test]
    fn layout_for_other_kinds() {
        let s = KeySettings::resolve(&cfg()).unwrap();
        let sony = s.layout_for(LayoutKind::Sonyflake, None).unwrap();
        assert_eq!(sony.epoch_ms, 1_409_529_600_000);
        assert_eq!(
            s.layout_for(LayoutKind::Instagram, Some(5))
                .unwrap()
                .epoch_ms,
            5
        );
        assert!(s.layout_for(LayoutKind::Custom, None).is_err());
    }
}

//! The 128-bit layouts, uuidv7 and ulid, as the generator and the commands see them: the room
//! of a millisecond, the node field, the value of an issued key (its millisecond, the counter
//! from `entropy`, the node, random bits), and the fields, text and parsing of any such ID.
//!
//! Both count unix milliseconds in 48 bits (epoch 1970, as their specifications fix), and both
//! put `node-bits` bits of the node id in the random field (`uuidv7` and `ulid` say where and
//! why), so that servers with different node ids never issue the same ID. What the generator
//! calls a key's `seq` is the increment of the millisecond's counter over its random start.

use super::codec::KeyError;
use super::entropy::Draw;
use super::format::Format;
use super::layout::{Form, KeyFields, Layout, LayoutError, LayoutKind};
use super::{ulid, uuidv7};

/// The most node bits either layout allows (as TSID's libraries for theirs).
pub const MAX_NODE_BITS: u32 = 20;
/// The generator's room in one millisecond is capped here: far above anything one call asks
/// (GENKEY COUNT is at most 100 000), and it keeps the generator's arithmetic in 64 bits.
const MAX_ROOM_BITS: u32 = 48;

/// Which 128-bit layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WideKind {
    Uuidv7,
    Ulid,
}

/// A 128-bit layout with its node width.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WideForm {
    pub kind: WideKind,
    pub node_bits: u32,
}

/// The fields of a 128-bit ID as DECODE shows them and ENCODE takes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WideParts {
    pub ms: u64,
    pub node: u64,
    /// uuidv7's counter (`rand_a` and 12 bits of `rand_b`); ulid has none apart from `random`.
    pub counter: Option<u64>,
    /// The random bits: uuidv7's after the node, ulid's whole randomness after the node.
    pub random: u128,
}

impl Layout {
    /// UUIDv7 (RFC 9562) with `node_bits` (at most 20) of node in `rand_b`.
    pub fn uuidv7(node_bits: u32) -> Layout {
        Layout::wide(WideKind::Uuidv7, node_bits)
    }

    /// ULID with `node_bits` (at most 20) of node at the top of its randomness.
    pub fn ulid(node_bits: u32) -> Layout {
        Layout::wide(WideKind::Ulid, node_bits)
    }

    fn wide(kind: WideKind, node_bits: u32) -> Layout {
        let layout_kind = match kind {
            WideKind::Uuidv7 => LayoutKind::Uuidv7,
            WideKind::Ulid => LayoutKind::Ulid,
        };
        Layout {
            kind: layout_kind,
            form: Form::Wide(WideForm {
                kind,
                node_bits: node_bits.min(MAX_NODE_BITS),
            }),
            epoch_ms: 0,
            unit_ms: 1,
        }
    }

    /// The 128-bit form, for uuidv7 and ulid.
    pub fn wide_form(&self) -> Option<WideForm> {
        match self.form {
            Form::Wide(w) => Some(w),
            _ => None,
        }
    }
}

fn mask(bits: u32) -> u128 {
    if bits >= 128 {
        u128::MAX
    } else {
        (1u128 << bits) - 1
    }
}

impl WideForm {
    /// The last millisecond either layout holds: 2^48 - 1 (year 10889).
    pub const MAX_MS: u64 = (1 << 48) - 1;

    /// Bits of the part that counts up within a millisecond.
    pub fn counter_bits(&self) -> u32 {
        match self.kind {
            WideKind::Uuidv7 => uuidv7::COUNTER_BITS,
            WideKind::Ulid => ulid::RANDOM_BITS - self.node_bits,
        }
    }

    /// Random bits drawn for each ID after the counter and the node.
    pub fn random_bits(&self) -> u32 {
        match self.kind {
            WideKind::Uuidv7 => uuidv7::AFTER_COUNTER_BITS - self.node_bits,
            WideKind::Ulid => ulid::RANDOM_BITS - self.node_bits,
        }
    }

    /// IDs one millisecond holds before the generator borrows the next: half the counter's room
    /// (the random start is below the other half).
    pub fn max_seq(&self) -> u64 {
        let room = (self.counter_bits() - 1).min(MAX_ROOM_BITS);
        (1u64 << room) - 1
    }

    pub fn max_node(&self) -> u64 {
        (1u64 << self.node_bits) - 1
    }

    /// The value of an issued key: `fields`' millisecond and node, the counter of its `seq`,
    /// and fresh random bits.
    #[inline]
    pub fn issued(&self, fields: &KeyFields, draw: &mut Draw<'_>) -> u128 {
        let counter = draw.counter(
            self.kind as usize,
            fields.tick,
            fields.seq,
            self.counter_bits(),
        );
        match self.kind {
            WideKind::Uuidv7 => uuidv7::pack(
                &uuidv7::Uuid7Parts {
                    ms: fields.tick,
                    counter: counter as u64,
                    node: fields.node,
                    random: draw.bits(self.random_bits()) as u64,
                },
                self.node_bits,
            ),
            WideKind::Ulid => ulid::pack(
                &ulid::UlidParts {
                    ms: fields.tick,
                    node: fields.node,
                    random: counter,
                },
                self.node_bits,
            ),
        }
    }

    /// The fields of a value this layout reads.
    pub fn parts(&self, v: u128) -> WideParts {
        match self.kind {
            WideKind::Uuidv7 => {
                let p = uuidv7::unpack(v, self.node_bits);
                WideParts {
                    ms: p.ms,
                    node: p.node,
                    counter: Some(p.counter),
                    random: u128::from(p.random),
                }
            }
            WideKind::Ulid => {
                let p = ulid::unpack(v, self.node_bits);
                WideParts {
                    ms: p.ms,
                    node: p.node,
                    counter: None,
                    random: p.random,
                }
            }
        }
    }

    /// The value of `parts`, or the error naming the field out of range.
    pub fn build(&self, p: &WideParts) -> Result<u128, LayoutError> {
        let check = |field: &'static str, value: u128, bits: u32| {
            if value > mask(bits) {
                Err(LayoutError::FieldRange {
                    field,
                    value: u64::try_from(value).unwrap_or(u64::MAX),
                    max: u64::try_from(mask(bits)).unwrap_or(u64::MAX),
                })
            } else {
                Ok(())
            }
        };
        check("time ms", u128::from(p.ms), 48)?;
        check("node", u128::from(p.node), self.node_bits)?;
        check("random", p.random, self.random_bits())?;
        Ok(match self.kind {
            WideKind::Uuidv7 => {
                let counter = p.counter.unwrap_or(0);
                check("seq", u128::from(counter), self.counter_bits())?;
                uuidv7::pack(
                    &uuidv7::Uuid7Parts {
                        ms: p.ms,
                        counter,
                        node: p.node,
                        random: p.random as u64,
                    },
                    self.node_bits,
                )
            }
            WideKind::Ulid => ulid::pack(
                &ulid::UlidParts {
                    ms: p.ms,
                    node: p.node,
                    random: p.random,
                },
                self.node_bits,
            ),
        })
    }

    /// Reads an ID of this layout in any of its forms (`format`, when given, must match).
    pub fn read(&self, text: &[u8], format: Option<Format>) -> Result<u128, KeyError> {
        let want = match format {
            None => None,
            Some(Format::Binary) => Some(16),
            Some(Format::Hex) => Some(32),
            Some(_) => Some(match self.kind {
                WideKind::Uuidv7 => uuidv7::TEXT_LEN,
                WideKind::Ulid => ulid::TEXT_LEN,
            }),
        };
        if let (Some(len), Some(f)) = (want, format) {
            if text.len() != len {
                return Err(KeyError::FormLength {
                    format: f.name(),
                    len: text.len(),
                    want: len,
                });
            }
        }
        match self.kind {
            WideKind::Uuidv7 => uuidv7::read(text).map_err(KeyError::Uuid),
            WideKind::Ulid => ulid::read(text).map_err(KeyError::Ulid),
        }
    }

    /// Writes `v` in `format` (text, hex or binary) into `out`; the bytes written.
    #[inline]
    pub fn write<'a>(&self, v: u128, format: Format, out: &'a mut [u8; 36]) -> &'a [u8] {
        match (format, self.kind) {
            (Format::Binary, _) => {
                out[..16].copy_from_slice(&v.to_be_bytes());
                &out[..16]
            }
            (Format::Hex, _) => {
                uuidv7::write_hex(v, &mut out[..32]);
                &out[..32]
            }
            (_, WideKind::Uuidv7) => {
                uuidv7::write_text(v, out);
                &out[..]
            }
            (_, WideKind::Ulid) => {
                crate::keys::crockford::encode(v, &mut out[..ulid::TEXT_LEN]);
                &out[..ulid::TEXT_LEN]
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::entropy::Entropy;

    fn fields(tick: u64, seq: u64, node: u64) -> KeyFields {
        KeyFields {
            tick,
            node,
            key_type: 0,
            seq,
        }
    }

    #[test]
    fn rooms_and_widths() {
        let u = Layout::uuidv7(10).wide_form().unwrap();
        assert_eq!(
            (u.counter_bits(), u.random_bits(), u.max_seq()),
            (24, 40, (1 << 23) - 1)
        );
        let l = Layout::ulid(10).wide_form().unwrap();
        assert_eq!(
            (l.counter_bits(), l.random_bits(), l.max_seq()),
            (70, 70, (1 << 48) - 1)
        );
        assert_eq!(Layout::ulid(0).wide_form().unwrap().max_node(), 0);
        assert_eq!(Layout::uuidv7(25).wide_form().unwrap().node_bits, 20);
        assert!(Layout::snowflake().wide_form().is_none());
    }

    #[test]
    fn issued_ids_carry_their_fields_and_increase() {
        let mut e = Entropy::from_seed([3; 32]);
        for layout in [
            Layout::uuidv7(10),
            Layout::ulid(10),
            Layout::uuidv7(0),
            Layout::ulid(20),
        ] {
            let w = layout.wide_form().unwrap();
            let mut d = e.ready().unwrap();
            let mut ids = Vec::new();
            for tick in [1_700_000_000_000, 1_700_000_000_001] {
                for seq in 0..50 {
                    ids.push(w.issued(&fields(tick, seq, w.max_node()), &mut d));
                }
            }
            assert!(ids.windows(2).all(|p| p[0] < p[1]), "{layout:?}");
            let p = w.parts(ids[3]);
            assert_eq!((p.ms, p.node), (1_700_000_000_000, w.max_node()));
            assert_eq!(w.build(&p), Ok(ids[3]));
            let mut out = [0u8; 36];
            for format in [Format::Text, Format::Hex, Format::Binary] {
                let text = w.write(ids[3], format, &mut out).to_vec();
                assert_eq!(w.read(&text, Some(format)), Ok(ids[3]));
                assert_eq!(w.read(&text, None), Ok(ids[3]));
            }
        }
    }

    #[test]
    fn build_checks_every_field() {
        let u = Layout::uuidv7(10).wide_form().unwrap();
        let p = WideParts {
            ms: 1 << 48,
            ..WideParts::default()
        };
        assert!(u.build(&p).unwrap_err().to_string().contains("time ms"));
        let p = WideParts {
            counter: Some(1 << 24),
            ..WideParts::default()
        };
        assert!(u
            .build(&p)
            .unwrap_err()
            .to_string()
            .contains("seq 16777216"));
        let p = WideParts {
            node: 1024,
            ..WideParts::default()
        };
        assert!(u.build(&p).unwrap_err().to_string().contains("node 1024"));
        let l = Layout::ulid(10).wide_form().unwrap();
        let p = WideParts {
            random: 1 << 70,
            ..WideParts::default()
        };
        assert!(l.build(&p).unwrap_err().to_string().contains("random"));
        assert_eq!(
            l.read(b"01ARZ3NDEKTSV4RRFFQ69G5FAV", Some(Format::Hex)),
            Err(KeyError::FormLength {
                format: "hex",
                len: 26,
                want: 32
            })
        );
    }
}

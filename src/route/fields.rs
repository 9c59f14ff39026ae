//! Shardjs's field-name dictionary (`subKeys`, `minify`/`maxify`) in the server: hash commands
//! routed by `SHARD.CALL` store short field names and reply the long ones, so millions of
//! hashes store `n`, `c` instead of `name`, `city` without a line of client code.
//!
//! Pure: the dictionary, which arguments of each hash command are field names, and the
//! translation of the reply back (field positions only, never values). A field outside the
//! dictionary passes unchanged. `HSCAN`'s `MATCH` pattern is left as given: it matches the
//! stored (short) names.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use crate::net::resp::Resp;

/// long name ↔ short name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldDict {
    short_of: HashMap<Vec<u8>, Vec<u8>>,
    long_of: HashMap<Vec<u8>, Vec<u8>>,
}

impl FieldDict {
    /// Parses `long:short long:short ...`. Refused: a pair that is not `long:short`, a long or
    /// a short name given twice, a short name equal to another entry's long name (a stored
    /// field could then not be told apart), a short name longer than its long one.
    pub fn parse(spec: &str) -> Result<FieldDict, String> {
        let mut d = FieldDict::default();
        for item in spec.split_whitespace() {
            let Some((long, short)) = item.split_once(':') else {
                return Err(format!("field '{item}' is not long:short (e.g. 'name:n')"));
            };
            if long.is_empty() || short.is_empty() || short.contains(':') {
                return Err(format!("field '{item}' is not long:short (e.g. 'name:n')"));
            }
            let (long, short) = (long.as_bytes().to_vec(), short.as_bytes().to_vec());
            if d.short_of.contains_key(&long) {
                return Err(format!(
                    "field '{}' is given twice",
                    String::from_utf8_lossy(&long)
                ));
            }
            if d.long_of.contains_key(&short) {
                return Err(format!(
                    "short name '{}' is given twice",
                    String::from_utf8_lossy(&short)
                ));
            }
            d.short_of.insert(long.clone(), short.clone());
            d.long_of.insert(short, long);
        }
        for (short, long) in &d.long_of {
            if short != long && d.short_of.contains_key(short) {
                return Err(format!(
                    "short name '{}' (of '{}') is also a long name in the dictionary",
                    String::from_utf8_lossy(short),
                    String::from_utf8_lossy(long)
                ));
            }
        }
        Ok(d)
    }

    pub fn is_empty(&self) -> bool {
        self.short_of.is_empty()
    }

    /// The stored name of `field`.
    pub fn minify<'a>(&'a self, field: &'a [u8]) -> &'a [u8] {
        self.short_of.get(field).map_or(field, Vec::as_slice)
    }

    /// The name a client sees for a stored `field`.
    pub fn maxify<'a>(&'a self, field: &'a [u8]) -> &'a [u8] {
        self.long_of.get(field).map_or(field, Vec::as_slice)
    }

    fn maxify_resp(&self, r: Resp) -> Resp {
        match r {
            Resp::Bulk(b) => Resp::Bulk(self.maxify(&b).to_vec()),
            other => other,
        }
    }
}

/// How a hash command's reply carries field names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldsInReply {
    /// None (`HGET`, `HSET`, `HINCRBY`, ...).
    None,
    /// `HGETALL`: field, value, ... (a map under RESP3).
    Pairs,
    /// `HKEYS`: every element.
    All,
    /// `HSCAN`: [cursor, [field, value, ...]].
    Scan,
    /// `HRANDFIELD key`: one field.
    One,
    /// `HRANDFIELD key count`: fields.
    AllOrOne,
    /// `HRANDFIELD key count WITHVALUES`: field, value, ... (pairs under RESP3).
    PairsOrNested,
}

/// The hash commands the dictionary applies to: for `args` (`args[0]` the name), the
/// positions of field names and how the reply carries them; `None` for other commands.
pub fn hash_command(args: &[&[u8]]) -> Option<(Vec<usize>, FieldsInReply)> {
    let name = args.first()?.to_ascii_lowercase();
    let n = args.len();
    let every_other = |from: usize| (from..n).step_by(2).collect::<Vec<_>>();
    let all_from = |from: usize| (from..n).collect::<Vec<_>>();
    Some(match name.as_slice() {
        b"hset" | b"hmset" => (every_other(2), FieldsInReply::None),
        b"hsetnx" | b"hget" | b"hexists" | b"hincrby" | b"hincrbyfloat" | b"hstrlen" => (
            vec![2].into_iter().filter(|&p| p < n).collect(),
            FieldsInReply::None,
        ),
        b"hmget" | b"hdel" => (all_from(2), FieldsInReply::None),
        b"hgetall" => (Vec::new(), FieldsInReply::Pairs),
        b"hkeys" => (Vec::new(), FieldsInReply::All),
        b"hscan" => (Vec::new(), FieldsInReply::Scan),
        b"hrandfield" => {
            let with_values = args
                .iter()
                .skip(3)
                .any(|a| a.eq_ignore_ascii_case(b"withvalues"));
            let how = match (n, with_values) {
                (2, _) => FieldsInReply::One,
                (_, true) => FieldsInReply::PairsOrNested,
                _ => FieldsInReply::AllOrOne,
            };
            (Vec::new(), how)
        }
        _ => return None,
    })
}

/// `args` with the field names at `positions` minified.
pub fn minify_args(dict: &FieldDict, args: &[&[u8]], positions: &[usize]) -> Vec<Vec<u8>> {
    args.iter()
        .enumerate()
        .map(|(i, a)| {
            if positions.contains(&i) {
                dict.minify(a).to_vec()
            } else {
                a.to_vec()
            }
        })
        .collect()
}

/// The reply with the field names it carries maxified.
pub fn maxify_reply(dict: &FieldDict, how: FieldsInReply, reply: Resp) -> Resp {
    let flat_pairs = |items: Vec<Resp>| {
        Resp::Array(
            items
                .into_iter()
                .enumerate()
                .map(|(i, r)| if i % 2 == 0 { dict.maxify_resp(r) } else { r })
                .collect(),
        )
    };
    match (how, reply) {
        (FieldsInReply::None, r) => r,
        (FieldsInReply::Pairs, Resp::Array(items)) => flat_pairs(items),
        (FieldsInReply::Pairs, Resp::Map(pairs)) => Resp::Map(
            pairs
                .into_iter()
                .map(|(k, v)| (dict.maxify_resp(k), v))
                .collect(),
        ),
        (FieldsInReply::All | FieldsInReply::AllOrOne, Resp::Array(items)) => {
            Resp::Array(items.into_iter().map(|r| dict.maxify_resp(r)).collect())
        }
        (FieldsInReply::One | FieldsInReply::AllOrOne, r @ Resp::Bulk(_)) => dict.maxify_resp(r),
        (FieldsInReply::Scan, Resp::Array(mut parts)) if parts.len() == 2 => {
            if let Some(Resp::Array(items)) = parts.pop() {
                parts.push(flat_pairs(items));
            }
            Resp::Array(parts)
        }
        (FieldsInReply::PairsOrNested, Resp::Array(items)) => {
            if items.iter().all(|i| matches!(i, Resp::Array(_))) && !items.is_empty() {
                // RESP3: [[field, value], ...]
                Resp::Array(
                    items
                        .into_iter()
                        .map(|pair| match pair {
                            Resp::Array(mut fv) if !fv.is_empty() => {
                                let f = fv.remove(0);
                                fv.insert(0, dict.maxify_resp(f));
                                Resp::Array(fv)
                            }
                            other => other,
                        })
                        .collect(),
                )
            } else {
                flat_pairs(items)
            }
        }
        (_, r) => r,
    }
}

static DICT: Mutex<Option<Arc<FieldDict>>> = Mutex::new(None);
static ACTIVE: AtomicBool = AtomicBool::new(false);

/// Installs the configured dictionary (empty: none).
pub fn install(dict: FieldDict) {
    let mut d = DICT.lock().unwrap_or_else(PoisonError::into_inner);
    ACTIVE.store(!dict.is_empty(), Ordering::Relaxed);
    *d = (!dict.is_empty()).then(|| Arc::new(dict));
}

/// Whether a dictionary is in force and `name` is one of the hash commands it applies to (the
/// command filter then leaves the call to SHARD.CALL, which translates).
pub fn translates(name: &[u8]) -> bool {
    if !ACTIVE.load(Ordering::Relaxed)
        || name.first().is_none_or(|c| !c.eq_ignore_ascii_case(&b'h'))
    {
        return false;
    }
    hash_command(&[name]).is_some()
}

/// The dictionary in force, if any.
pub fn current() -> Option<Arc<FieldDict>> {
    DICT.lock().unwrap_or_else(PoisonError::into_inner).clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dict() -> FieldDict {
        FieldDict::parse("name:n city:c password:p userid:u email:e").unwrap()
    }

    fn bulk(s: &str) -> Resp {
        Resp::Bulk(s.as_bytes().to_vec())
    }

    #[test]
    fn parse_and_refuse() {
        let d = dict();
        assert_eq!(d.minify(b"name"), b"n");
        assert_eq!(d.maxify(b"c"), b"city");
        assert_eq!(d.minify(b"age"), b"age");
        assert!(FieldDict::parse("name").unwrap_err().contains("long:short"));
        assert!(FieldDict::parse("name:n name:m")
            .unwrap_err()
            .contains("given twice"));
        assert!(FieldDict::parse("name:n nick:n")
            .unwrap_err()
            .contains("given twice"));
        assert!(FieldDict::parse("name:n n:x")
            .unwrap_err()
            .contains("also a long name"));
        assert!(FieldDict::parse("").unwrap().is_empty());
    }

    #[test]
    fn field_positions_of_each_command() {
        let args =
            |s: &str| -> Vec<Vec<u8>> { s.split(' ').map(|a| a.as_bytes().to_vec()).collect() };
        let pos = |s: &str| {
            let a = args(s);
            let refs: Vec<&[u8]> = a.iter().map(Vec::as_slice).collect();
            hash_command(&refs).map(|(p, _)| p)
        };
        assert_eq!(pos("HSET k name John city London"), Some(vec![2, 4]));
        assert_eq!(pos("HMSET k name John"), Some(vec![2]));
        assert_eq!(pos("HSETNX k name John"), Some(vec![2]));
        assert_eq!(pos("HGET k name"), Some(vec![2]));
        assert_eq!(pos("HMGET k name city age"), Some(vec![2, 3, 4]));
        assert_eq!(pos("HDEL k name city"), Some(vec![2, 3]));
        assert_eq!(pos("HEXISTS k name"), Some(vec![2]));
        assert_eq!(pos("HINCRBY k userid 1"), Some(vec![2]));
        assert_eq!(pos("HINCRBYFLOAT k userid 1.5"), Some(vec![2]));
        assert_eq!(pos("HSTRLEN k name"), Some(vec![2]));
        assert_eq!(pos("HGETALL k"), Some(vec![]));
        assert_eq!(pos("HKEYS k"), Some(vec![]));
        assert_eq!(pos("HSCAN k 0 MATCH n*"), Some(vec![]));
        assert_eq!(pos("HRANDFIELD k 2 WITHVALUES"), Some(vec![]));
        assert_eq!(pos("GET k"), None);
    }

    #[test]
    fn replies_are_maxified_at_field_positions_only() {
        let d = dict();
        // A value equal to a short name stays a value.
        let r2 = Resp::Array(vec![bulk("n"), bulk("c"), bulk("c"), bulk("London")]);
        assert_eq!(
            maxify_reply(&d, FieldsInReply::Pairs, r2),
            Resp::Array(vec![bulk("name"), bulk("c"), bulk("city"), bulk("London")])
        );
        let r3 = Resp::Map(vec![(bulk("n"), bulk("n"))]);
        assert_eq!(
            maxify_reply(&d, FieldsInReply::Pairs, r3),
            Resp::Map(vec![(bulk("name"), bulk("n"))])
        );
        let scan = Resp::Array(vec![bulk("0"), Resp::Array(vec![bulk("e"), bulk("x@y")])]);
        assert_eq!(
            maxify_reply(&d, FieldsInReply::Scan, scan),
            Resp::Array(vec![
                bulk("0"),
                Resp::Array(vec![bulk("email"), bulk("x@y")])
            ])
        );
        assert_eq!(
            maxify_reply(&d, FieldsInReply::One, bulk("u")),
            bulk("userid")
        );
        let nested = Resp::Array(vec![Resp::Array(vec![bulk("p"), bulk("p")])]);
        assert_eq!(
            maxify_reply(&d, FieldsInReply::PairsOrNested, nested),
            Resp::Array(vec![Resp::Array(vec![bulk("password"), bulk("p")])])
        );
        let keys = Resp::Array(vec![bulk("n"), bulk("age")]);
        assert_eq!(
            maxify_reply(&d, FieldsInReply::All, keys),
            Resp::Array(vec![bulk("name"), bulk("age")])
        );
        assert_eq!(maxify_reply(&d, FieldsInReply::None, bulk("n")), bulk("n"));
    }
}

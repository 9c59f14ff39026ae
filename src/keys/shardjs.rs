//! Shardjs's own key functions, as its code writes them (`lib/shardjs.js` 0.2.3): fixed keys
//! (`fixedKey`), the special keys named in its configuration, changing a key's type
//! (`changeKeyType`) and a key's decimal form (`toDecimalString`). Pure.

use super::base62;
use super::layout::SHARDJS_FIELD_MAX;

/// `toInt62(x, z)`: base62, zero-filled to at least `z` characters.
pub fn to_int62(x: u64, min_width: usize) -> Vec<u8> {
    let mut digits = [0u8; base62::MAX_WIDTH];
    let n = base62::encode_unpadded(x, &mut digits);
    let mut out = vec![b'0'; min_width.saturating_sub(n)];
    out.extend_from_slice(&digits[..n]);
    out
}

/// A fixed key's suffix as Shardjs keeps it: every character outside `0-9A-Za-z` removed.
pub fn clean_suffix(suffix: &[u8]) -> Vec<u8> {
    suffix
        .iter()
        .copied()
        .filter(u8::is_ascii_alphanumeric)
        .collect()
}

/// `fixedKey(ts, variant, type, suffix)`: the offset from the epoch, the variant (modulo 3844)
/// and the type, each in base62 of at least two characters, then `-` and the cleaned suffix
/// when one is given.
pub fn fixed_key(offset: u64, variant: u64, key_type: u64, suffix: Option<&[u8]>) -> Vec<u8> {
    let mut key = to_int62(offset, 2);
    key.extend(to_int62(variant % (SHARDJS_FIELD_MAX + 1), 2));
    key.extend(to_int62(key_type, 2));
    if let Some(s) = suffix.filter(|s| !s.is_empty()) {
        key.push(b'-');
        key.extend(clean_suffix(s));
    }
    key
}

/// A key cut at its first `-`: the key proper, and a fixed key's suffix.
pub fn split_suffix(key: &[u8]) -> (&[u8], Option<&[u8]>) {
    match memchr::memchr(b'-', key) {
        Some(at) => (&key[..at], Some(&key[at + 1..])),
        None => (key, None),
    }
}

/// `changeKeyType(key, type)`: the same key with another type (its last two characters before
/// a fixed key's suffix; the suffix is kept). `None` for a key too short to have a type.
pub fn retype(key: &[u8], key_type: u64) -> Option<Vec<u8>> {
    let (body, suffix) = split_suffix(key);
    if body.len() < 5 || key_type > SHARDJS_FIELD_MAX {
        return None;
    }
    let mut out = body[..body.len() - 2].to_vec();
    out.extend(to_int62(key_type, 2));
    if let Some(s) = suffix {
        out.push(b'-');
        out.extend_from_slice(s);
    }
    Some(out)
}

/// `toDecimalString(key)`: the time offset in decimal, then the variant and the type, each
/// zero-filled to four decimal digits, so that keys compare as numbers in JavaScript.
pub fn decimal(tick: u64, variant: u64, key_type: u64) -> String {
    format!("{tick}{variant:04}{key_type:04}")
}

/// One special key of the configuration: its name, offset and type (a name or a number).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecialKey {
    pub name: String,
    pub offset: u64,
    pub key_type: String,
}

/// Parses `name:offset:type ...` (Shardjs's `specialKeys: {users: [0, 'index'], ...}`).
pub fn parse_special_keys(spec: &str) -> Result<Vec<SpecialKey>, String> {
    let mut out: Vec<SpecialKey> = Vec::new();
    for item in spec.split_whitespace() {
        let parts: Vec<&str> = item.split(':').collect();
        let [name, offset, key_type] = parts.as_slice() else {
            return Err(format!(
                "special key '{item}' is not name:offset:type (e.g. 'emails:2:index')"
            ));
        };
        if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric()) {
            return Err(format!(
                "special key name '{name}' must be letters and digits (Shardjs keeps only those in a suffix)"
            ));
        }
        let offset: u64 = offset.parse().map_err(|_| {
            format!("special key '{name}': offset '{offset}' is not a whole number")
        })?;
        if key_type.is_empty() {
            return Err(format!("special key '{name}' has no type"));
        }
        if out.iter().any(|k| k.name == *name) {
            return Err(format!("special key '{name}' is given twice"));
        }
        out.push(SpecialKey {
            name: name.to_string(),
            offset,
            key_type: key_type.to_string(),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_keys_as_shardjs_writes_them() {
        // The README: specialKeys {users: [0,'index'], usernames: [1,'index'], emails: [2,'index']}
        // with index = type 0.
        assert_eq!(fixed_key(2, 0, 0, Some(b"emails")), b"020000-emails");
        assert_eq!(fixed_key(0, 0, 0, Some(b"users")), b"000000-users");
        assert_eq!(fixed_key(1, 0, 0, Some(b"usernames")), b"010000-usernames");
        assert_eq!(fixed_key(2, 0, 0, None), b"020000");
        assert_eq!(fixed_key(62 * 62, 3845, 1, Some(b"a b!c")), b"1000101-abc");
        assert_eq!(fixed_key(1595487784, 190, 1, None), b"1jyVFw3401");
    }

    #[test]
    fn change_key_type_keeps_the_suffix() {
        assert_eq!(
            retype(b"1jyVFw3401", 5).as_deref(),
            Some(&b"1jyVFw3405"[..])
        );
        assert_eq!(
            retype(b"020000-emails", 62).as_deref(),
            Some(&b"020010-emails"[..])
        );
        assert_eq!(retype(b"1jyV", 5), None);
        assert_eq!(retype(b"1jyVFw3401", 3844), None);
    }

    #[test]
    fn decimal_form_of_the_readme_keys() {
        // 1jyVFw3401: offset 1595487784, variant 190, type 1; 1jyVFw3501 the next variant.
        assert_eq!(decimal(1595487784, 190, 1), "159548778401900001");
        assert_eq!(decimal(1595487784, 191, 1), "159548778401910001");
    }

    #[test]
    fn special_keys_config() {
        let keys = parse_special_keys("users:0:index usernames:1:index emails:2:3").unwrap();
        assert_eq!(keys.len(), 3);
        assert_eq!(
            keys[2],
            SpecialKey {
                name: "emails".into(),
                offset: 2,
                key_type: "3".into()
            }
        );
        assert!(parse_special_keys("users:0")
            .unwrap_err()
            .contains("name:offset:type"));
        assert!(parse_special_keys("us-ers:0:1")
            .unwrap_err()
            .contains("letters and digits"));
        assert!(parse_special_keys("a:x:1")
            .unwrap_err()
            .contains("not a whole number"));
        assert!(parse_special_keys("a:1:1 a:2:1")
            .unwrap_err()
            .contains("twice"));
        assert_eq!(parse_special_keys("").unwrap(), vec![]);
    }
}

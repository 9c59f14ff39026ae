//! Named key types (Shardjs's key types): `user:2 group:3 comment:4`.

use std::fmt;

/// The configured type names, each with its number.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TypeNames {
    entries: Vec<(String, u64)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TypeNamesError(String);

impl fmt::Display for TypeNamesError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid types: {}", self.0)
    }
}

impl TypeNames {
    /// Parses `name:number` pairs separated by spaces; names and numbers are unique, names
    /// are not numbers (so `TYPE 3` is never ambiguous).
    pub fn parse(spec: &str) -> Result<TypeNames, TypeNamesError> {
        let mut entries: Vec<(String, u64)> = Vec::new();
        for item in spec.split_whitespace() {
            let (name, number) = item
                .rsplit_once(':')
                .ok_or_else(|| TypeNamesError(format!("'{item}' is not name:number")))?;
            if name.is_empty() || name.bytes().all(|b| b.is_ascii_digit()) {
                return Err(TypeNamesError(format!(
                    "'{item}': a type name must not be empty or a number"
                )));
            }
            let number: u64 = number.parse().map_err(|_| {
                TypeNamesError(format!("'{item}': '{number}' is not a type number"))
            })?;
            if entries.iter().any(|(n, _)| n == name) {
                return Err(TypeNamesError(format!("type name '{name}' is given twice")));
            }
            if entries.iter().any(|(_, v)| *v == number) {
                return Err(TypeNamesError(format!(
                    "type number {number} is given twice"
                )));
            }
            entries.push((name.to_owned(), number));
        }
        Ok(TypeNames { entries })
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The largest number configured.
    pub fn max_number(&self) -> Option<u64> {
        self.entries.iter().map(|(_, v)| *v).max()
    }

    /// The number of a name (exact, case-sensitive).
    pub fn number_of(&self, name: &[u8]) -> Option<u64> {
        self.entries
            .iter()
            .find(|(n, _)| n.as_bytes() == name)
            .map(|(_, v)| *v)
    }

    /// The name of a number, if it has one.
    pub fn name_of(&self, number: u64) -> Option<&str> {
        self.entries
            .iter()
            .find(|(_, v)| *v == number)
            .map(|(n, _)| n.as_str())
    }

    /// The canonical text (as `CONFIG GET` would show it).
    pub fn to_spec(&self) -> String {
        let parts: Vec<String> = self
            .entries
            .iter()
            .map(|(n, v)| format!("{n}:{v}"))
            .collect();
        parts.join(" ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_names_and_numbers() {
        let t = TypeNames::parse("user:2  group:3 comment:4").unwrap();
        assert_eq!(t.number_of(b"group"), Some(3));
        assert_eq!(t.name_of(4), Some("comment"));
        assert_eq!(t.name_of(5), None);
        assert_eq!(t.max_number(), Some(4));
        assert_eq!(t.to_spec(), "user:2 group:3 comment:4");
        assert!(TypeNames::parse("").unwrap().is_empty());
    }

    #[test]
    fn rejects_bad_specs() {
        for bad in [
            "user",
            "user:x",
            "user:2 user:3",
            "a:2 b:2",
            ":2",
            "12:3",
            "u:-1",
        ] {
            assert!(TypeNames::parse(bad).is_err(), "{bad}");
        }
    }
}

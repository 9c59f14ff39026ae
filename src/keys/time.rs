//! Unix milliseconds as ISO 8601 text in UTC, like `2012-01-19T19:11:27.784Z`.

use chrono::DateTime;

/// The ISO 8601 UTC text of `ms`, or `None` outside the range chrono represents.
pub fn iso8601_ms(ms: i64) -> Option<String> {
    DateTime::from_timestamp_millis(ms).map(|t| t.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_with_milliseconds() {
        assert_eq!(
            iso8601_ms(1_327_000_287_784).unwrap(),
            "2012-01-19T19:11:27.784Z"
        );
        assert_eq!(iso8601_ms(0).unwrap(), "1970-01-01T00:00:00.000Z");
        assert!(iso8601_ms(i64::MAX).is_none());
    }
}

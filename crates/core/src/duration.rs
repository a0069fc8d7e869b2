//! The one duration parser: the HTTP API's strict `?wait=` syntax (docs/api.md) and the
//! configuration's wider one, side by side in [`parse_duration`].

use std::fmt;
use std::time::Duration;

/// Which texts [`parse_duration`] accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DurationSyntax {
    /// The API's `?wait=` syntax, which the OpenAPI document declares as the pattern
    /// `^[0-9]{1,9}(ms|s|m|h)?$`: one to nine digits, then `ms`, `s`, `m`, `h` or nothing
    /// (seconds). Nothing else: no spaces, signs, fractions or compound forms.
    Strict,
    /// Configuration files and `TOLLGATE_*` variables: humantime's syntax (`"200ms"`,
    /// `"2s"`, `"1h 30m"`, `"2min"`), surrounding whitespace ignored. Every strict text
    /// that has a unit is accepted with the same meaning; a bare number is not (a file
    /// says its unit).
    Config,
}

/// A text that is not a duration in the syntax asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DurationError {
    text: String,
    syntax: DurationSyntax,
    reason: Option<String>,
}

impl fmt::Display for DurationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.syntax {
            DurationSyntax::Strict => write!(
                f,
                "{:?} is not a duration like 30s: give a number of seconds, or a number \
                 (at most nine digits) with ms, s, m or h",
                self.text
            ),
            DurationSyntax::Config => write!(
                f,
                "invalid duration {:?} ({}); write e.g. \"200ms\", \"2s\", \"1h\"",
                self.text,
                self.reason.as_deref().unwrap_or("not a duration")
            ),
        }
    }
}

impl std::error::Error for DurationError {}

/// Parses `text` as a duration in `syntax`. The one place durations are read.
pub fn parse_duration(text: &str, syntax: DurationSyntax) -> Result<Duration, DurationError> {
    let error = |reason: Option<String>| DurationError {
        text: text.to_string(),
        syntax,
        reason,
    };
    match syntax {
        DurationSyntax::Strict => {
            let digits = text.bytes().take_while(u8::is_ascii_digit).count();
            let (number, unit) = text.split_at(digits);
            let millis_per = match unit {
                "ms" => Some(1),
                "" | "s" => Some(1_000),
                "m" => Some(60_000),
                "h" => Some(3_600_000),
                _ => None,
            };
            match (millis_per, number.parse::<u64>(), digits) {
                (Some(per), Ok(n), 1..=9) => Ok(Duration::from_millis(n * per)),
                _ => Err(error(None)),
            }
        }
        DurationSyntax::Config => {
            humantime::parse_duration(text.trim()).map_err(|e| error(Some(e.to_string())))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strict_takes_digits_and_one_unit() {
        let strict = |t| parse_duration(t, DurationSyntax::Strict);
        assert_eq!(strict("30").unwrap(), Duration::from_secs(30));
        assert_eq!(strict("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(strict("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(strict("1h").unwrap(), Duration::from_secs(3600));
        for bad in [
            "",
            "s",
            "1.5s",
            " 1s",
            "1 s",
            "-1",
            "1d",
            "1234567890",
            "1h 30m",
        ] {
            assert!(strict(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn config_takes_every_strict_text_with_a_unit() {
        for text in ["500ms", "30s", "2m", "1h", "999999999s"] {
            assert_eq!(
                parse_duration(text, DurationSyntax::Config).unwrap(),
                parse_duration(text, DurationSyntax::Strict).unwrap(),
                "{text}"
            );
        }
        assert_eq!(
            parse_duration(" 1h 30m ", DurationSyntax::Config).unwrap(),
            Duration::from_secs(5400)
        );
        assert!(parse_duration("soon", DurationSyntax::Config).is_err());
    }
}

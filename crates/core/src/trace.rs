//! W3C Trace Context (`traceparent`, version `00`): the pure parse and format that the
//! server uses for a caller's header and the store uses for a task's saved trace
//! position (docs/telemetry.md).

use std::fmt;
use std::str::FromStr;

/// A position in a distributed trace: the trace, the span a child continues from, and
/// the trace flags (bit 0: sampled). Written as
/// `00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceParent {
    /// The trace's id (never all zero).
    pub trace_id: [u8; 16],
    /// The parent span's id (never all zero).
    pub parent_id: [u8; 8],
    /// The trace flags; bit 0 is "sampled".
    pub flags: u8,
}

/// Why a `traceparent` value was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TraceParentError {
    /// Not four `-`-separated fields of the sizes version 00 gives them.
    #[error("traceparent must be 00-<32 hex>-<16 hex>-<2 hex>")]
    Shape,
    /// A field holds something other than lowercase hexadecimal digits.
    #[error("traceparent fields must be lowercase hexadecimal")]
    NotHex,
    /// Version `ff` is forbidden by the W3C rules.
    #[error("traceparent version ff is invalid")]
    Version,
    /// The trace id or parent id is all zeros.
    #[error("traceparent ids must not be all zeros")]
    ZeroId,
}

/// Bit 0 of the trace flags.
const SAMPLED: u8 = 0x01;

impl TraceParent {
    /// Parses a `traceparent` header value. Versions above `00` are read by their first
    /// four fields (the W3C forward-compatibility rule); a version-00 value must be exactly
    /// 55 characters.
    pub fn parse(value: &str) -> Result<TraceParent, TraceParentError> {
        let value = value.trim();
        let mut parts = value.split('-');
        let (Some(version), Some(trace), Some(parent), Some(flags)) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(TraceParentError::Shape);
        };
        if version.len() != 2 || trace.len() != 32 || parent.len() != 16 || flags.len() != 2 {
            return Err(TraceParentError::Shape);
        }
        let version = hex_bytes::<1>(version)?[0];
        if version == 0xff {
            return Err(TraceParentError::Version);
        }
        if version == 0 && parts.next().is_some() {
            return Err(TraceParentError::Shape);
        }
        let trace_id = hex_bytes::<16>(trace)?;
        let parent_id = hex_bytes::<8>(parent)?;
        let flags = hex_bytes::<1>(flags)?[0];
        if trace_id == [0; 16] || parent_id == [0; 8] {
            return Err(TraceParentError::ZeroId);
        }
        Ok(TraceParent {
            trace_id,
            parent_id,
            flags,
        })
    }

    /// Whether the caller sampled this trace (flags bit 0).
    pub fn sampled(&self) -> bool {
        self.flags & SAMPLED != 0
    }

    /// The trace id as 32 lowercase hexadecimal digits (what the task view shows).
    pub fn trace_id_hex(&self) -> String {
        hex(&self.trace_id)
    }

    /// The parent span id as 16 lowercase hexadecimal digits.
    pub fn parent_id_hex(&self) -> String {
        hex(&self.parent_id)
    }
}

impl fmt::Display for TraceParent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "00-{}-{}-{:02x}",
            self.trace_id_hex(),
            self.parent_id_hex(),
            self.flags
        )
    }
}

impl FromStr for TraceParent {
    type Err = TraceParentError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        TraceParent::parse(s)
    }
}

/// Stored and sent as its header text.
impl serde::Serialize for TraceParent {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for TraceParent {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        TraceParent::parse(&text).map_err(serde::de::Error::custom)
    }
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
    out
}

fn hex_bytes<const N: usize>(text: &str) -> Result<[u8; N], TraceParentError> {
    fn digit(c: u8) -> Result<u8, TraceParentError> {
        match c {
            b'0'..=b'9' => Ok(c - b'0'),
            b'a'..=b'f' => Ok(c - b'a' + 10),
            _ => Err(TraceParentError::NotHex),
        }
    }
    let raw = text.as_bytes();
    if raw.len() != N * 2 {
        return Err(TraceParentError::Shape);
    }
    let mut out = [0u8; N];
    for (i, pair) in raw.chunks_exact(2).enumerate() {
        out[i] = digit(pair[0])? << 4 | digit(pair[1])?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn parses_and_formats_the_w3c_example() {
        let t = TraceParent::parse(EXAMPLE).unwrap();
        assert_eq!(t.trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(t.parent_id_hex(), "00f067aa0ba902b7");
        assert!(t.sampled());
        assert_eq!(t.to_string(), EXAMPLE);
    }

    #[test]
    fn unsampled_flag_is_kept() {
        let t =
            TraceParent::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00").unwrap();
        assert!(!t.sampled());
        assert!(t.to_string().ends_with("-00"));
    }

    #[test]
    fn refuses_malformed_values() {
        let cases = [
            ("", TraceParentError::Shape),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
                TraceParentError::Shape,
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
                TraceParentError::Shape,
            ),
            (
                "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
                TraceParentError::NotHex,
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902bz-01",
                TraceParentError::NotHex,
            ),
            (
                "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                TraceParentError::Version,
            ),
            (
                "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
                TraceParentError::ZeroId,
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
                TraceParentError::ZeroId,
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
                TraceParentError::Shape,
            ),
        ];
        for (value, want) in cases {
            assert_eq!(TraceParent::parse(value), Err(want), "{value:?}");
        }
    }

    #[test]
    fn a_later_version_is_read_by_its_first_four_fields() {
        let t =
            TraceParent::parse("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-future")
                .unwrap();
        assert_eq!(t.to_string(), EXAMPLE);
    }

    proptest::proptest! {
        #[test]
        fn format_then_parse_is_identity(trace in proptest::array::uniform16(1u8..), parent in proptest::array::uniform8(1u8..), flags: u8) {
            let t = TraceParent { trace_id: trace, parent_id: parent, flags };
            proptest::prop_assert_eq!(TraceParent::parse(&t.to_string()), Ok(t));
        }
    }
}

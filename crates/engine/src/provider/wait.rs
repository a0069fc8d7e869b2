//! The waits a provider's headers ask for (`retry-after-ms`, `Retry-After`, rate-limit
//! resets as RFC 3339 times), read defensively: anything a provider, or a proxy before
//! it, sends never panics and never asks for more than a day.

use reqwest::header::HeaderMap;
use std::time::{Duration, SystemTime};

/// The longest wait a header can ask for, before any configured cap: a day. Anything
/// longer reads as a day (and is then cut to `max_pause` or refused by
/// `max_retry_delay`).
const LONGEST_HEADER_WAIT: Duration = Duration::from_secs(24 * 3600);

/// The wait a provider asks for: `retry-after-ms` (OpenAI's, in milliseconds), else
/// `Retry-After` in seconds or as an HTTP date. Read defensively, as anything a
/// provider (or a proxy before it) sends: values that are not text, not a number or a
/// date, negative, NaN or infinite are ignored (as if absent); a date in the past is 0;
/// a huge value reads as [`LONGEST_HEADER_WAIT`]. Never panics.
pub fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    retry_after_at(headers, SystemTime::now())
}

fn retry_after_at(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let text = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|t| !t.is_empty())
    };
    let seconds = |n: f64| -> Option<Duration> {
        (n.is_finite() && n >= 0.0)
            .then(|| Duration::from_secs_f64(n.min(LONGEST_HEADER_WAIT.as_secs_f64())))
    };
    if let Some(wait) = text("retry-after-ms")
        .and_then(|t| t.parse::<f64>().ok())
        .and_then(|ms| seconds(ms / 1000.0))
    {
        return Some(wait);
    }
    let value = text("retry-after")?;
    match value.parse::<f64>() {
        Ok(n) => seconds(n),
        Err(_) => httpdate::parse_http_date(value).ok().map(|at| {
            at.duration_since(now)
                .unwrap_or(Duration::ZERO)
                .min(LONGEST_HEADER_WAIT)
        }),
    }
}

/// The wait until an RFC 3339 time (`2026-12-03T06:10:00Z`, fractions and offsets
/// allowed), as rate-limit reset headers give it: 0 for a time in the past, at most a
/// day; `None` for anything else. Never panics.
pub fn wait_until_rfc3339(value: &str, now: SystemTime) -> Option<Duration> {
    let at = parse_rfc3339(value.trim())?;
    let now = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .ok()?
        .as_secs_f64();
    let wait = (at - now).clamp(0.0, LONGEST_HEADER_WAIT.as_secs_f64());
    wait.is_finite().then(|| Duration::from_secs_f64(wait))
}

/// Seconds since the Unix epoch of an RFC 3339 date-time.
fn parse_rfc3339(text: &str) -> Option<f64> {
    let b = text.as_bytes();
    let digits = |range: std::ops::Range<usize>| -> Option<i64> {
        let part = b.get(range)?;
        part.iter().all(u8::is_ascii_digit).then_some(())?;
        std::str::from_utf8(part).ok()?.parse().ok()
    };
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    if b[13] != b':' || b[16] != b':' {
        return None;
    }
    let (year, month, day) = (digits(0..4)?, digits(5..7)?, digits(8..10)?);
    let (hour, minute, second) = (digits(11..13)?, digits(14..16)?, digits(17..19)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 {
        return None;
    }
    if second > 60 {
        return None;
    }
    let mut rest = &text[19..];
    let mut fraction = 0.0;
    if let Some(after) = rest.strip_prefix('.') {
        let n = after.bytes().take_while(u8::is_ascii_digit).count();
        if n == 0 || n > 9 {
            return None;
        }
        fraction = format!("0.{}", &after[..n]).parse().ok()?;
        rest = &after[n..];
    }
    let offset = match rest {
        "Z" | "z" => 0,
        _ => {
            let o = rest.as_bytes();
            if o.len() != 6 || !matches!(o[0], b'+' | b'-') || o[3] != b':' {
                return None;
            }
            let hours: i64 = rest.get(1..3)?.parse().ok()?;
            let minutes: i64 = rest.get(4..6)?.parse().ok()?;
            if hours > 23 || minutes > 59 {
                return None;
            }
            let sign = if o[0] == b'-' { -1 } else { 1 };
            sign * (hours * 3600 + minutes * 60)
        }
    };
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let seconds = days * 86_400 + hour * 3600 + minute * 60 + second - offset;
    Some(seconds as f64 + fraction)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_resets_are_read_defensively() {
        let now = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        // 1_800_000_000 is 2027-01-15T08:00:00Z.
        let wait = |t: &str| wait_until_rfc3339(t, now);
        assert_eq!(wait("2027-01-15T08:00:30Z"), Some(Duration::from_secs(30)));
        assert_eq!(
            wait("2027-01-15T08:00:01.5Z"),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(
            wait("2027-01-15T09:00:30+01:00"),
            Some(Duration::from_secs(30))
        );
        assert_eq!(wait("2020-01-01T00:00:00Z"), Some(Duration::ZERO));
        assert_eq!(wait("9999-12-31T23:59:59Z"), Some(LONGEST_HEADER_WAIT));
        for bad in [
            "",
            "soon",
            "2027-13-01T00:00:00Z",
            "2027-01-15T25:00:00Z",
            "2027-01-15T08:00:00",
            "2027-01-15T08:00:00+1:00",
            "2027-01-15T08:00:00.Z",
            "２０２７-01-15T08:00:00Z",
            "2027-01-15T08:00:00.1234567890Z",
        ] {
            assert_eq!(wait(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn retry_after_reads_both_headers() {
        let mut h = HeaderMap::new();
        h.insert("retry-after", "2".parse().unwrap());
        assert_eq!(retry_after(&h), Some(Duration::from_secs(2)));
        h.insert("retry-after-ms", "150".parse().unwrap());
        assert_eq!(retry_after(&h), Some(Duration::from_millis(150)));
    }

    /// Issue 26 item 13: hostile values never panic, never ask for more than a day, and
    /// an unreadable `retry-after-ms` falls back to `Retry-After`.
    #[test]
    fn retry_after_reads_hostile_headers_defensively() {
        use reqwest::header::HeaderValue;
        let now = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let day = LONGEST_HEADER_WAIT;
        let read = |ms: Option<&[u8]>, secs: Option<&[u8]>| {
            let mut h = HeaderMap::new();
            if let Some(v) = ms {
                h.insert("retry-after-ms", HeaderValue::from_bytes(v).unwrap());
            }
            if let Some(v) = secs {
                h.insert("retry-after", HeaderValue::from_bytes(v).unwrap());
            }
            retry_after_at(&h, now)
        };
        // Huge, in every notation: capped at a day (1e23 ms panicked before).
        for huge in [
            &b"1e23"[..],
            b"1e308",
            b"18446744073709551616",
            b"99999999999999999999999999",
        ] {
            assert_eq!(read(Some(huge), None), Some(day), "{huge:?}");
            assert_eq!(read(None, Some(huge)), Some(day), "{huge:?}");
        }
        assert_eq!(read(None, Some(b"1000000000")), Some(day));
        // Not a usable number: ignored.
        for bad in [
            &b"NaN"[..],
            b"nan",
            b"inf",
            b"-inf",
            b"infinity",
            b"-1",
            b"-0.5",
            b"1e400x",
            b"soon",
            b"",
            b"   ",
            b"0x10",
            b"\xff\xfe",
        ] {
            assert_eq!(read(Some(bad), None), None, "{bad:?}");
            assert_eq!(read(None, Some(bad)), None, "{bad:?}");
        }
        // A bad `retry-after-ms` falls back to a good `Retry-After`.
        assert_eq!(read(Some(b"NaN"), Some(b"3")), Some(Duration::from_secs(3)));
        // Fractions, zero and surrounding space.
        assert_eq!(
            read(Some(b" 250.5 "), None),
            Some(Duration::from_micros(250_500))
        );
        assert_eq!(read(None, Some(b"0")), Some(Duration::ZERO));
        // HTTP dates: in the future, in the past, far away, malformed.
        let in_90s = httpdate::fmt_http_date(now + Duration::from_secs(90));
        assert_eq!(
            read(None, Some(in_90s.as_bytes())),
            Some(Duration::from_secs(90))
        );
        let past = httpdate::fmt_http_date(now - Duration::from_secs(90));
        assert_eq!(read(None, Some(past.as_bytes())), Some(Duration::ZERO));
        assert_eq!(
            read(None, Some(b"Fri, 31 Dec 9999 23:59:59 GMT")),
            Some(day)
        );
        assert_eq!(read(None, Some(b"Fri, 32 Dec 2025 25:61:61 GMT")), None);
    }
}

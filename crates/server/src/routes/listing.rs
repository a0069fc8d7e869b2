//! What the listings (docs/conformance.md#listings: `GET /v1/tasks`, `/v1/runs`, `/v1/pipelines`,
//! `/v1/scopes`) share: their query parameters' parsing, page sizes and cursors. A bad
//! filter or cursor is a 400 with the error envelope, and nothing changes.

use crate::error::ApiError;
use axum::extract::Query;
use axum::extract::rejection::QueryRejection;
use serde::Deserialize;
use tollgate_core::Timestamp;
use tollgate_store::list::{LIST_MAX_PAGE, ListCursor};

pub(super) fn query<T>(q: Result<Query<T>, QueryRejection>) -> Result<T, ApiError> {
    q.map(|Query(v)| v)
        .map_err(|e| ApiError::malformed(e.body_text()))
}

/// A filter's value, or 400 naming the parameter.
pub(super) fn filter<T, E: std::fmt::Display>(
    name: &str,
    value: Option<String>,
    parse: impl FnOnce(String) -> Result<T, E>,
) -> Result<Option<T>, ApiError> {
    value
        .map(|v| parse(v).map_err(|e| ApiError::malformed(format!("{name}: {e}"))))
        .transpose()
}

pub(super) fn limit(value: Option<u32>) -> Result<u32, ApiError> {
    match value {
        None => Ok(tollgate_store::list::LIST_DEFAULT_PAGE),
        Some(n @ 1..=LIST_MAX_PAGE) => Ok(n),
        Some(n) => Err(ApiError::malformed(format!(
            "limit: must be between 1 and {LIST_MAX_PAGE}, got {n}"
        ))),
    }
}

pub(super) fn cursor(next: Option<String>, listing: char) -> Result<Option<ListCursor>, ApiError> {
    filter("next", next, |n| {
        ListCursor::decode(&n, listing).map_err(|_| "not a cursor this listing gave out")
    })
}

/// Values of a comma-separated list parameter (`status=queued,running`); empty items
/// (`status=queued,`) are refused.
pub(super) fn list_of<T>(
    name: &str,
    value: Option<String>,
    parse: impl Fn(&str) -> Option<T>,
    allowed: &str,
) -> Result<Vec<T>, ApiError> {
    // An empty value is the empty list (`state=`, how an empty array is sent): no filter.
    let Some(value) = value.filter(|v| !v.is_empty()) else {
        return Ok(Vec::new());
    };
    value
        .split(',')
        .map(|v| {
            parse(v).ok_or_else(|| {
                ApiError::malformed(format!("{name}: {v:?} is not one of {allowed}"))
            })
        })
        .collect()
}

/// An RFC 3339 date-time (`2026-12-01T10:00:00Z`, `2026-12-01T11:00:00.5+01:00`) as
/// milliseconds since the epoch.
pub(super) fn parse_rfc3339(text: &str) -> Result<Timestamp, String> {
    let bad = || format!("{text:?} is not an RFC 3339 date-time like 2026-12-01T10:00:00Z");
    let b = text.as_bytes();
    let num = |r: std::ops::Range<usize>| -> Result<i64, String> {
        let s = text.get(r).ok_or_else(bad)?;
        if s.is_empty() || !s.bytes().all(|c| c.is_ascii_digit()) {
            return Err(bad());
        }
        s.parse::<i64>().map_err(|_| bad())
    };
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return Err(bad());
    }
    if b[13] != b':' || b[16] != b':' {
        return Err(bad());
    }
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, minute, second) = (num(11..13)?, num(14..16)?, num(17..19)?);
    let mut i = 19;
    let mut millis = 0i64;
    if b[i] == b'.' {
        let start = i + 1;
        i = start;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        if i == start {
            return Err(bad());
        }
        let digits = &text[start..i.min(start + 3)];
        millis = digits.parse::<i64>().map_err(|_| bad())? * 10i64.pow(3 - digits.len() as u32);
    }
    let offset_minutes = match b.get(i) {
        Some(b'Z' | b'z') if i + 1 == b.len() => 0,
        Some(sign @ (b'+' | b'-')) if i + 6 == b.len() && b[i + 3] == b':' => {
            let (h, m) = (num(i + 1..i + 3)?, num(i + 4..i + 6)?);
            if h > 23 || m > 59 {
                return Err(bad());
            }
            if *sign == b'+' {
                h * 60 + m
            } else {
                -(h * 60 + m)
            }
        }
        _ => return Err(bad()),
    };
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    let days_in_month = match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        2 => 28,
        _ => return Err(bad()),
    };
    if day < 1 || day > days_in_month || hour > 23 || minute > 59 || second > 60 {
        return Err(bad());
    }
    // Days from the civil date (Howard Hinnant's algorithm); a leap second counts as :59.
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let seconds = days * 86_400 + hour * 3600 + minute * 60 + second.min(59) - offset_minutes * 60;
    Ok(Timestamp(seconds * 1000 + millis))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PageParams {
    pub(super) limit: Option<u32>,
    pub(super) next: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::parse_rfc3339;

    #[test]
    fn rfc3339() {
        assert_eq!(parse_rfc3339("1970-01-01T00:00:00Z").unwrap().0, 0);
        assert_eq!(parse_rfc3339("1970-01-01T01:00:00.5+01:00").unwrap().0, 500);
        assert_eq!(
            parse_rfc3339("2026-12-01T10:00:00.123456Z").unwrap().0,
            1_796_119_200_123
        );
        assert_eq!(
            parse_rfc3339("0000-03-01T00:00:00Z").unwrap().0,
            -62_162_035_200_000
        );
        for bad in [
            "",
            "2026-13-01T00:00:00Z",
            "2026-02-30T00:00:00Z",
            "2026-12-01",
            "2026-12-01T10:00:00",
            "2026-12-01T10:00:00.Z",
        ] {
            assert!(parse_rfc3339(bad).is_err(), "{bad}");
        }
    }
}

//! Canonical JSON (RFC 8785) and SHA-256 hashes: input hash, cache key, model config hash.

use crate::error::InvalidInput;
use serde_json::Value;
use sha2::{Digest, Sha256};

/// Largest integer magnitude that survives RFC 8785's IEEE-754 number form unchanged.
pub const MAX_SAFE_INTEGER: u64 = (1 << 53) - 1;

/// Deepest nesting accepted in any JSON Tollgate hashes or stores.
pub const MAX_DEPTH: usize = 64;

/// Rejects numbers beyond ±(2^53 − 1) and nesting deeper than [`MAX_DEPTH`]. RFC 8785
/// writes numbers as doubles, so two different large integers would otherwise share a
/// canonical form and so a hash; and a double that large is always integral and would be
/// written back as an integer beyond 2^53, which could not be read and hashed again.
pub fn check_hashable(value: &Value) -> Result<(), InvalidInput> {
    check_at(value, "", 0)
}

fn check_at(value: &Value, path: &str, depth: usize) -> Result<(), InvalidInput> {
    if depth > MAX_DEPTH {
        return Err(InvalidInput::field(
            path,
            format!("JSON is nested deeper than {MAX_DEPTH} levels"),
        ));
    }
    match value {
        Value::Number(n) => {
            let too_big = if let Some(u) = n.as_u64() {
                u > MAX_SAFE_INTEGER
            } else if let Some(i) = n.as_i64() {
                i.unsigned_abs() > MAX_SAFE_INTEGER
            } else {
                n.as_f64()
                    .is_some_and(|f| f.abs() > MAX_SAFE_INTEGER as f64)
            };
            if too_big {
                return Err(InvalidInput::field(
                    path,
                    format!("number {n} is beyond ±2^53 and cannot be represented exactly"),
                ));
            }
            Ok(())
        }
        Value::Array(items) => items
            .iter()
            .enumerate()
            .try_for_each(|(i, v)| check_at(v, &format!("{path}[{i}]"), depth + 1)),
        Value::Object(map) => map.iter().try_for_each(|(k, v)| {
            let p = if path.is_empty() {
                k.clone()
            } else {
                format!("{path}.{k}")
            };
            check_at(v, &p, depth + 1)
        }),
        _ => Ok(()),
    }
}

/// The RFC 8785 canonical text of a value (sorted keys, no insignificant whitespace),
/// after [`check_hashable`].
pub fn canonical_json(value: &Value) -> Result<String, InvalidInput> {
    check_hashable(value)?;
    serde_json_canonicalizer::to_string(value)
        .map_err(|e| InvalidInput::field("", format!("cannot canonicalize JSON: {e}")))
}

/// Lower-case hex SHA-256 of bytes.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// SHA-256 of the canonical text of a value.
pub fn hash_value(value: &Value) -> Result<String, InvalidInput> {
    Ok(sha256_hex(canonical_json(value)?.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    #[test]
    fn key_order_and_whitespace_do_not_matter() {
        let a: Value =
            serde_json::from_str(r#"{"b": [1, 2, {"z": 1, "a": 2}], "a": "x"}"#).unwrap();
        let b: Value = serde_json::from_str(r#"{"a":"x","b":[1,2,{"a":2,"z":1}]}"#).unwrap();
        assert_eq!(
            canonical_json(&a).unwrap(),
            r#"{"a":"x","b":[1,2,{"a":2,"z":1}]}"#
        );
        assert_eq!(hash_value(&a).unwrap(), hash_value(&b).unwrap());
    }

    #[test]
    fn integers_beyond_2_pow_53_are_rejected() {
        assert!(canonical_json(&json!(9_007_199_254_740_991u64)).is_ok());
        assert!(canonical_json(&json!(-9_007_199_254_740_991i64)).is_ok());
        let err = canonical_json(&json!({"n": [9_007_199_254_740_992u64]})).unwrap_err();
        assert!(err.to_string().contains("n[0]"), "{err}");
        assert!(canonical_json(&json!(-9_007_199_254_740_993i64)).is_err());
        // A double that large is an integer in disguise.
        assert!(canonical_json(&json!(1e17)).is_err());
        assert!(canonical_json(&json!(-3.5e300)).is_err());
        assert!(canonical_json(&json!(1.5e15)).is_ok());
    }

    #[test]
    fn deep_nesting_is_rejected() {
        let mut v = json!(1);
        for _ in 0..(MAX_DEPTH + 1) {
            v = json!([v]);
        }
        assert!(canonical_json(&v).is_err());
    }

    fn arb_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            (-(1i64 << 53) + 1..(1i64 << 53)).prop_map(|n| json!(n)),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(|f| json!(f.clamp(-9.0e15, 9.0e15))),
            ".{0,8}".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 32, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                proptest::collection::btree_map(".{0,6}", inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    /// Reverses the key order of every object (serde_json keeps insertion order here only
    /// if preserve_order is on; re-serializing through text checks the same property).
    fn reorder(v: &Value) -> Value {
        match v {
            Value::Object(m) => {
                let mut pairs: Vec<_> = m.iter().collect();
                pairs.reverse();
                Value::Object(
                    pairs
                        .into_iter()
                        .map(|(k, v)| (k.clone(), reorder(v)))
                        .collect(),
                )
            }
            Value::Array(a) => Value::Array(a.iter().map(reorder).collect()),
            other => other.clone(),
        }
    }

    proptest! {
        #[test]
        fn canonical_form_is_stable_and_parses_back(v in arb_json()) {
            let c = canonical_json(&v).unwrap();
            let back: Value = serde_json::from_str(&c).unwrap();
            prop_assert_eq!(canonical_json(&back).unwrap(), c.clone());
            prop_assert_eq!(canonical_json(&reorder(&v)).unwrap(), c);
        }
    }
}

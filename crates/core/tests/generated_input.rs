//! Generated input (issue 8): property tests over request parsing, validation, output
//! validation and canonical hashing, on the stable toolchain.
//!
//! - Arbitrary bytes, arbitrary JSON and near-valid requests of every kind never panic:
//!   they are accepted or refused with an error.
//! - An accepted request hashes the same whatever the client's key order and whitespace,
//!   and its canonical text is within the size limit and validates again to the same hash.
//! - An integer beyond ±2^53 anywhere in a request is refused, never hashed.
//! - Output validation of arbitrary JSON against any accepted request never panics.
//!
//! Cases: proptest's default (256) per property; `PROPTEST_CASES` for more.

use proptest::prelude::*;
use serde_json::{Map, Value, json};
use tollgate_core::canonical::{MAX_SAFE_INTEGER, canonical_json, hash_value};
use tollgate_core::{TaskKind, ValidatedRequest, validate_output};

const LIMIT: usize = 256 * 1024;

fn arb_number() -> impl Strategy<Value = Value> {
    prop_oneof![
        4 => (-(MAX_SAFE_INTEGER as i64)..=MAX_SAFE_INTEGER as i64).prop_map(|n| json!(n)),
        1 => any::<i64>().prop_map(|n| json!(n)),
        1 => any::<u64>().prop_map(|n| json!(n)),
        1 => any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| json!(f)),
    ]
}

fn arb_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        arb_number(),
        "\\PC{0,12}".prop_map(Value::String),
        prop_oneof![
            Just("type"),
            Just("object"),
            Just("string"),
            Just("integer"),
            Just("$ref"),
            Just("#"),
            Just("properties")
        ]
        .prop_map(|s| Value::String(s.to_string())),
    ];
    leaf.prop_recursive(5, 48, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            proptest::collection::btree_map(
                prop_oneof![
                    "[a-z_$]{0,8}",
                    Just("type".to_string()),
                    Just("properties".to_string()),
                    Just("required".to_string()),
                    Just("items".to_string()),
                    Just("$ref".to_string()),
                    Just("enum".to_string()),
                ],
                inner,
                0..6
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn arb_text() -> impl Strategy<Value = Value> {
    prop_oneof![
        4 => "\\PC{1,20}".prop_map(Value::String),
        1 => Just(json!("")),
        1 => arb_json(),
    ]
}

fn arb_labels() -> impl Strategy<Value = Value> {
    prop_oneof![
        4 => proptest::collection::vec("[a-z]{1,6}", 1..6).prop_map(|v| json!(v)),
        1 => proptest::collection::vec(
            ("[a-z]{1,6}", proptest::option::of("\\PC{0,10}")).prop_map(|(name, d)| match d {
                Some(d) => json!({"name": name, "description": d}),
                None => json!({"name": name}),
            }),
            1..5
        )
        .prop_map(Value::Array),
        1 => arb_json(),
    ]
}

fn arb_schema() -> impl Strategy<Value = Value> {
    prop_oneof![
        3 => proptest::collection::btree_map(
            "[a-z]{1,6}",
            prop_oneof![
                Just(json!({"type": "string"})),
                Just(json!({"type": "integer", "maximum": 100})),
                Just(json!({"type": "number"})),
                Just(json!({"type": "array", "items": {"type": "string"}})),
                Just(json!({"enum": ["a", "b"]})),
            ],
            0..5
        )
        .prop_map(|props| {
            let required: Vec<&String> = props.keys().collect();
            json!({"type": "object", "properties": props, "required": required})
        }),
        1 => arb_json(),
    ]
}

/// A near-valid request for `kind`: the right fields with random values, some fields
/// missing, sometimes an extra one.
fn arb_request(kind: TaskKind) -> BoxedStrategy<Value> {
    let extra = proptest::option::weighted(0.1, ("[a-z]{1,6}", arb_json()));
    let fields: BoxedStrategy<Vec<(String, Value)>> = match kind {
        TaskKind::GenerateText => (
            arb_text(),
            proptest::option::of(arb_text()),
            proptest::option::of(prop_oneof![
                4 => (1u32..8192).prop_map(|n| json!(n)),
                1 => arb_number(),
            ]),
            proptest::option::of(prop_oneof![
                4 => (0u32..=20).prop_map(|t| json!(f64::from(t) / 10.0)),
                1 => arb_number(),
            ]),
            any::<bool>(),
        )
            .prop_map(|(text, system, max, temp, messages)| {
                let mut f = vec![if messages {
                    (
                        "messages".to_string(),
                        json!([{"role": "user", "content": text}]),
                    )
                } else {
                    ("prompt".to_string(), text)
                }];
                if let Some(s) = system {
                    f.push(("system".into(), s));
                }
                if let Some(m) = max {
                    f.push(("max_output_tokens".into(), m));
                }
                if let Some(t) = temp {
                    f.push(("temperature".into(), t));
                }
                f
            })
            .boxed(),
        TaskKind::Classify => (arb_text(), arb_labels(), proptest::option::of(arb_text()))
            .prop_map(|(input, labels, instructions)| {
                let mut f = vec![("input".to_string(), input), ("labels".into(), labels)];
                if let Some(i) = instructions {
                    f.push(("instructions".into(), i));
                }
                f
            })
            .boxed(),
        TaskKind::ClassifyMany => (
            proptest::collection::vec(("[a-z0-9]{0,4}", arb_text()), 0..5),
            arb_labels(),
        )
            .prop_map(|(items, labels)| {
                let items: Vec<Value> = items
                    .into_iter()
                    .map(|(id, input)| json!({"id": id, "input": input}))
                    .collect();
                vec![
                    ("items".to_string(), json!(items)),
                    ("labels".into(), labels),
                ]
            })
            .boxed(),
        TaskKind::ExtractData => (arb_text(), arb_schema())
            .prop_map(|(input, schema)| {
                vec![("input".to_string(), input), ("schema".into(), schema)]
            })
            .boxed(),        TaskKind::Chat => (
            arb_text(),
            arb_schema(),
            proptest::option::of(prop_oneof![
                Just(json!("auto")),
                Just(json!("required")),
                Just(json!({"type": "function", "function": {"name": "tool"}})),
                arb_json(),
            ]),
            any::<bool>(),
        )
            .prop_map(|(text, parameters, choice, called)| {
                let mut messages = vec![json!({"role": "user", "content": text})];
                if called {
                    messages.push(json!({"role": "assistant", "content": null, "tool_calls": [
                        {"id": "c1", "type": "function", "function": {"name": "tool", "arguments": "{}"}}]}));
                    messages.push(json!({"role": "tool", "tool_call_id": "c1", "content": "ok"}));
                }
                let mut f = vec![
                    ("messages".to_string(), json!(messages)),
                    (
                        "tools".into(),
                        json!([{"type": "function", "function": {"name": "tool", "parameters": parameters}}]),
                    ),
                ];
                if let Some(c) = choice {
                    f.push(("tool_choice".into(), c));
                }
                f
            })
            .boxed(),
        TaskKind::Embed => (
            proptest::collection::vec(arb_text(), 0..4),
            proptest::option::of(prop_oneof![
                4 => (1u32..64).prop_map(|n| json!(n)),
                1 => arb_number(),
            ]),
        )
            .prop_map(|(texts, dimensions)| {
                let mut f = vec![("input".to_string(), json!(texts))];
                if let Some(d) = dimensions {
                    f.push(("dimensions".into(), d));
                }
                f
            })
            .boxed(),
    };
    (fields, extra)
        .prop_map(|(mut fields, extra)| {
            if let Some((k, v)) = extra {
                fields.push((k, v));
            }
            Value::Object(fields.into_iter().collect::<Map<String, Value>>())
        })
        .boxed()
}

fn arb_kind() -> impl Strategy<Value = TaskKind> {
    proptest::sample::select(TaskKind::ALL.to_vec())
}

/// Writes `v` as JSON text with every object's keys in an order chosen by `seed` and
/// some whitespace, as a client might.
fn write_shuffled(v: &Value, seed: u64, out: &mut String) {
    match v {
        Value::Object(m) => {
            let mut pairs: Vec<(&String, &Value)> = m.iter().collect();
            let n = pairs.len();
            for i in (1..n).rev() {
                let j = (seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(i as u64)
                    >> 33) as usize
                    % (i + 1);
                pairs.swap(i, j);
            }
            out.push_str("{ ");
            for (i, (k, v)) in pairs.into_iter().enumerate() {
                if i > 0 {
                    out.push_str(" ,\n ");
                }
                out.push_str(&serde_json::to_string(k).unwrap());
                out.push_str(" : ");
                write_shuffled(v, seed.rotate_left(7) ^ i as u64, out);
            }
            out.push_str(" }");
        }
        Value::Array(a) => {
            out.push('[');
            for (i, v) in a.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_shuffled(v, seed ^ (i as u64 + 1), out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// Puts `n` somewhere inside `v` (replacing a leaf, or adding a field).
fn plant(v: &mut Value, n: Value, path: &[usize]) {
    match v {
        Value::Object(m) if !m.is_empty() => {
            let i = path.first().copied().unwrap_or(0) % m.len();
            let key = m.keys().nth(i).unwrap().clone();
            plant(m.get_mut(&key).unwrap(), n, &path[path.len().min(1)..]);
        }
        Value::Array(a) if !a.is_empty() => {
            let i = path.first().copied().unwrap_or(0) % a.len();
            plant(&mut a[i], n, &path[path.len().min(1)..]);
        }
        Value::Object(m) => {
            m.insert("n".into(), n);
        }
        other => *other = n,
    }
}

proptest! {
    /// Arbitrary bytes: parsing and validation never panic.
    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256), kind in arb_kind()) {
        if let Ok(v) = serde_json::from_slice::<Value>(&bytes) {
            let _ = ValidatedRequest::new(kind, &v, LIMIT);
            let _ = canonical_json(&v);
        }
        let _ = TaskKind::parse(&String::from_utf8_lossy(&bytes));
    }

    /// Arbitrary JSON as a request of any kind: accepted or refused, never a panic.
    #[test]
    fn arbitrary_json_never_panics(v in arb_json(), kind in arb_kind()) {
        let _ = ValidatedRequest::new(kind, &v, LIMIT);
    }

    /// Near-valid requests: no panic; an accepted one hashes the same from any key order
    /// and whitespace, keeps within the limit, and its stored form validates again to the
    /// same hash; output validation of arbitrary JSON never panics.
    #[test]
    fn accepted_requests_hash_the_same_whatever_the_key_order(
        (kind, request) in arb_kind().prop_flat_map(|k| (Just(k), arb_request(k))),
        seed in any::<u64>(),
        output in arb_json(),
    ) {
        let Ok(validated) = ValidatedRequest::new(kind, &request, LIMIT) else {
            return Ok(());
        };
        prop_assert!(validated.canonical().len() <= LIMIT);
        let mut text = String::new();
        write_shuffled(&request, seed, &mut text);
        let reparsed: Value = serde_json::from_str(&text).unwrap();
        let again = ValidatedRequest::new(kind, &reparsed, LIMIT)
            .expect("the same request in another key order is valid too");
        prop_assert_eq!(again.input_hash(), validated.input_hash());
        prop_assert_eq!(again.canonical(), validated.canonical());
        let stored: Value = serde_json::from_str(validated.canonical()).unwrap();
        let restored = ValidatedRequest::from_stored(&stored).expect("the stored form reads back");
        prop_assert_eq!(restored.input_hash(), validated.input_hash());
        prop_assert_eq!(hash_value(&stored).unwrap(), validated.input_hash());
        let _ = validate_output(validated.request(), &output);
    }

    /// An integer beyond ±2^53 anywhere in a request is refused, for every kind.
    #[test]
    fn integers_beyond_2_pow_53_are_refused_anywhere(
        (kind, request) in arb_kind().prop_flat_map(|k| (Just(k), arb_request(k))),
        big in prop_oneof![
            (MAX_SAFE_INTEGER + 1..=u64::MAX).prop_map(|n| json!(n)),
            (i64::MIN..-(MAX_SAFE_INTEGER as i64)).prop_map(|n| json!(n)),
        ],
        path in proptest::collection::vec(any::<usize>(), 0..6),
    ) {
        let mut request = request;
        plant(&mut request, big.clone(), &path);
        prop_assert!(
            ValidatedRequest::new(kind, &request, LIMIT).is_err(),
            "{} accepted in {}", big, request
        );
        prop_assert!(canonical_json(&request).is_err());
    }
}

//! The output size limit (`max_output_bytes`): the rule that refuses, at submit, a request
//! whose smallest valid output cannot fit, and the measure of an actual output.
//!
//! Sizes are bytes of compact JSON, the form the store keeps. The floor of a request is a
//! **lower bound** of the size of every output its kind's contract accepts: a request is
//! refused only when no valid output could fit, never for a schema that merely looks big.
//! For `extract_data` the floor is computed from the caller's schema in one pass over it
//! (each subschema once, `$ref`s followed once and memoized), so its cost is proportional
//! to the schema's size, never to the numbers written in it.

use super::{ClassifyManyRequest, TaskRequest, check_schema_cost};
use crate::error::{InvalidInput, OutputTooLarge};
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::io;

/// Most causes named in a refusal.
const MAX_CAUSES: usize = 4;
/// Deepest nesting of subschemas (and `$ref`s) followed; deeper parts count as 1 byte.
const MAX_DEPTH: usize = 256;
/// `{"text":""}`.
const EMPTY_TEXT_OUTPUT: u64 = 11;

/// The size of `output` as stored (compact JSON), or [`OutputTooLarge`] as soon as it
/// passes `max_output_bytes`: measuring stops there, so a huge output costs no more than
/// the limit to reject.
pub fn check_output_size(output: &Value, max_output_bytes: usize) -> Result<usize, OutputTooLarge> {
    json_size(output, max_output_bytes).ok_or(OutputTooLarge {
        limit: max_output_bytes,
    })
}

/// Refuses (`invalid_request`, naming the keywords) a request whose smallest valid output
/// is larger than `max_output_bytes`: such a task could never succeed, and building or
/// storing its output would cost far more than the limit allows.
///
/// For `extract_data` it first applies [`check_schema_cost`]: a schema whose validation
/// could take unbounded time (over [`MAX_SCHEMA_EXPANSION`](super::MAX_SCHEMA_EXPANSION)
/// subschemas with its `$ref`s followed, and the other caps named there) is refused
/// before anything walks it.
pub fn check_output_fits(
    request: &TaskRequest,
    max_output_bytes: usize,
) -> Result<(), InvalidInput> {
    let limit = max_output_bytes as u64;
    let (field, floor, because) = match request {
        TaskRequest::GenerateText(_) => (
            "request",
            EMPTY_TEXT_OUTPUT,
            "even an empty text output (`{\"text\":\"\"}`)".to_string(),
        ),
        TaskRequest::Classify(r) => {
            let shortest = r.labels.iter().map(|l| l.name().len()).min().unwrap_or(0);
            // {"label":"…"}
            (
                "request.labels",
                12 + shortest as u64,
                "the shortest label in `{\"label\": …}`".to_string(),
            )
        }
        TaskRequest::ClassifyMany(r) => (
            "request.items",
            classify_many_floor(r),
            format!(
                "one result per item ({} items) with its id and the shortest label",
                r.items.len()
            ),
        ),
        TaskRequest::ExtractData(r) => {
            check_schema_cost(&r.schema)?;
            let mut walk = Walk::new(&r.schema);
            let Some(floor) = walk.floor(&r.schema, "", 0) else {
                // No value satisfies the schema: not a size question.
                return Ok(());
            };
            let because = if floor.causes.is_empty() {
                "its smallest valid value".to_string()
            } else {
                floor
                    .causes
                    .iter()
                    .map(Cause::to_string)
                    .collect::<Vec<_>>()
                    .join(" × ")
            };
            ("request.schema", floor.bytes, because)
        }
        // A tool's `parameters` passed the schema cost check when the request was parsed.
        TaskRequest::Chat(_) => (
            "request",
            super::chat_output::CHAT_OUTPUT_FLOOR,
            "even an empty answer (`{\"content\":\"\",\"finish_reason\":\"stop\"}`)".to_string(),
        ),
        TaskRequest::Embed(r) => {
            // {"embeddings":[[0,…],…],"dimensions":1}: 31 bytes, each vector of d
            // one-digit numbers 2d + 1 with its comma (the dimension is unknown without
            // `dimensions`: at least 1).
            let n = r.input.len() as u64;
            let d = u64::from(r.dimensions.unwrap_or(1));
            (
                "request.input",
                31 + n * (2 * d + 1),
                format!("one vector of {d} numbers per item ({n} items)"),
            )
        }
    };
    if floor <= limit {
        return Ok(());
    }
    Err(InvalidInput::field(
        field,
        format!(
            "no output could fit: {because} needs at least {floor} bytes of JSON, over the \
             output limit of {max_output_bytes} bytes (max_output_bytes)"
        ),
    ))
}

/// `{"results":[{"id":"…","label":"…"},…]}` with the shortest label everywhere.
fn classify_many_floor(r: &ClassifyManyRequest) -> u64 {
    let shortest = r.labels.iter().map(|l| l.name().len()).min().unwrap_or(0) as u64;
    let n = r.items.len() as u64;
    let ids: u64 = r.items.iter().map(|i| i.id.len() as u64).sum();
    // {"results":[ ]} is 14 bytes, each result {"id":"","label":""} 20 plus its texts.
    14 + ids + n * (20 + shortest) + n.saturating_sub(1)
}

/// A writer that counts and fails once past a limit.
struct Counter {
    count: usize,
    limit: usize,
}

impl io::Write for Counter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.count = self.count.saturating_add(buf.len());
        if self.count > self.limit {
            return Err(io::Error::other("over the limit"));
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Bytes of `value` as compact JSON, `None` when over `limit`.
pub(crate) fn json_size<T: serde::Serialize + ?Sized>(value: &T, limit: usize) -> Option<usize> {
    let mut counter = Counter { count: 0, limit };
    serde_json::to_writer(&mut counter, value)
        .ok()
        .map(|()| counter.count)
}

/// One keyword that makes the floor large.
#[derive(Debug, Clone)]
struct Cause {
    keyword: &'static str,
    value: u64,
    at: String,
}

impl std::fmt::Display for Cause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let at = if self.at.is_empty() { "/" } else { &self.at };
        if self.value == 0 {
            write!(f, "`{}` at {at}", self.keyword)
        } else {
            write!(f, "`{}` {} at {at}", self.keyword, self.value)
        }
    }
}

/// A lower bound of the size of every value a subschema accepts, with what makes it so.
#[derive(Debug, Clone)]
struct Floor {
    bytes: u64,
    causes: Vec<Cause>,
}

impl Floor {
    fn of(bytes: u64) -> Floor {
        Floor {
            bytes,
            causes: Vec::new(),
        }
    }

    fn because(mut self, cause: Cause, rest: &[Cause]) -> Floor {
        let mut causes = vec![cause];
        causes.extend(rest.iter().take(MAX_CAUSES - 1).cloned());
        self.causes = causes;
        self
    }

    fn max(a: Floor, b: Floor) -> Floor {
        if b.bytes > a.bytes { b } else { a }
    }
}

/// One pass over a schema. `None` floors mean "no value satisfies this".
struct Walk<'a> {
    root: &'a Value,
    /// Draft 4–7: keywords beside `$ref` are ignored.
    legacy_ref: bool,
    memo: HashMap<*const Value, Option<Floor>>,
    in_progress: HashMap<*const Value, ()>,
}

impl<'a> Walk<'a> {
    fn new(root: &'a Value) -> Walk<'a> {
        let legacy_ref = root
            .get("$schema")
            .and_then(Value::as_str)
            .is_some_and(|s| {
                ["draft-04", "draft-06", "draft-07"]
                    .iter()
                    .any(|d| s.contains(d))
            });
        Walk {
            root,
            legacy_ref,
            memo: HashMap::new(),
            in_progress: HashMap::new(),
        }
    }

    fn floor(&mut self, schema: &'a Value, at: &str, depth: usize) -> Option<Floor> {
        if depth > MAX_DEPTH {
            return Some(Floor::of(1));
        }
        let key = schema as *const Value;
        if let Some(known) = self.memo.get(&key) {
            return known.clone();
        }
        if self.in_progress.contains_key(&key) {
            // A recursive schema: the cycle adds nothing we can count on.
            return Some(Floor::of(1));
        }
        self.in_progress.insert(key, ());
        let result = self.compute(schema, at, depth);
        self.in_progress.remove(&key);
        self.memo.insert(key, result.clone());
        result
    }

    fn compute(&mut self, schema: &'a Value, at: &str, depth: usize) -> Option<Floor> {
        let map = match schema {
            Value::Bool(true) => return Some(Floor::of(1)),
            Value::Bool(false) => return None,
            Value::Object(map) => map,
            _ => return Some(Floor::of(1)),
        };
        let target = match map.get("$ref").and_then(Value::as_str) {
            Some(r) => resolve(self.root, r),
            None => None,
        };
        if let Some(target) = target {
            let reference = map.get("$ref").and_then(Value::as_str).unwrap_or_default();
            let referred = self.floor(target, reference.trim_start_matches('#'), depth + 1)?;
            if self.legacy_ref {
                return Some(referred);
            }
            let own = self.own(map, at, depth)?;
            return Some(Floor::max(own, referred));
        }
        self.own(map, at, depth)
    }

    /// Everything but `$ref`.
    fn own(&mut self, map: &'a Map<String, Value>, at: &str, depth: usize) -> Option<Floor> {
        if let Some(value) = map.get("const") {
            let bytes = json_size(value, usize::MAX).unwrap_or(1) as u64;
            return Some(Floor::of(bytes).because(
                Cause {
                    keyword: "const",
                    value: 0,
                    at: at.to_string(),
                },
                &[],
            ));
        }
        let mut floor = match map.get("enum") {
            Some(Value::Array(options)) => {
                let smallest = options
                    .iter()
                    .map(|o| json_size(o, usize::MAX).unwrap_or(1) as u64)
                    .min()?;
                Floor::of(smallest).because(
                    Cause {
                        keyword: "enum",
                        value: 0,
                        at: at.to_string(),
                    },
                    &[],
                )
            }
            _ => self.by_type(map, at, depth)?,
        };
        if let Some(Value::Array(parts)) = map.get("allOf") {
            for (i, part) in parts.iter().enumerate() {
                let part = self.floor(part, &format!("{at}/allOf/{i}"), depth + 1)?;
                floor = Floor::max(floor, part);
            }
        }
        for combinator in ["anyOf", "oneOf"] {
            if let Some(Value::Array(options)) = map.get(combinator) {
                let mut smallest: Option<Floor> = None;
                for (i, option) in options.iter().enumerate() {
                    if let Some(f) =
                        self.floor(option, &format!("{at}/{combinator}/{i}"), depth + 1)
                        && smallest.as_ref().is_none_or(|s| f.bytes < s.bytes)
                    {
                        smallest = Some(f);
                    }
                }
                floor = Floor::max(floor, smallest?);
            }
        }
        Some(floor)
    }

    /// The smallest floor over the types the schema allows.
    fn by_type(&mut self, map: &'a Map<String, Value>, at: &str, depth: usize) -> Option<Floor> {
        const ALL: [&str; 6] = ["null", "boolean", "number", "string", "array", "object"];
        let types: Vec<&str> = match map.get("type") {
            Some(Value::String(t)) => vec![t.as_str()],
            Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
            _ => ALL.to_vec(),
        };
        let mut best: Option<Floor> = None;
        for ty in types {
            let floor = match ty {
                "null" | "boolean" => Some(Floor::of(4)),
                "number" | "integer" => Some(Floor::of(1)),
                "string" => Some(string_floor(map, at)),
                "array" => self.array_floor(map, at, depth),
                "object" => self.object_floor(map, at, depth),
                _ => Some(Floor::of(1)),
            };
            if let Some(f) = floor
                && best.as_ref().is_none_or(|b| f.bytes < b.bytes)
            {
                best = Some(f);
            }
        }
        best
    }

    fn array_floor(
        &mut self,
        map: &'a Map<String, Value>,
        at: &str,
        depth: usize,
    ) -> Option<Floor> {
        let min = count(map, "minItems");
        if min == 0 {
            return Some(Floor::of(2));
        }
        // 2020-12: prefixItems + items; drafts before: items as an array + additionalItems.
        let (prefix, rest, rest_key): (&[Value], Option<&Value>, &str) =
            match (map.get("prefixItems"), map.get("items")) {
                (Some(Value::Array(p)), rest) => (p, rest, "items"),
                (_, Some(Value::Array(p))) => (p, map.get("additionalItems"), "additionalItems"),
                (_, rest) => (&[], rest, "items"),
            };
        let mut bytes = 2 + (min - 1);
        let mut largest: Option<Floor> = None;
        let mut taken = 0u64;
        for (i, schema) in prefix.iter().enumerate() {
            if taken == min {
                break;
            }
            let f = self.floor(
                schema,
                &format!(
                    "{at}/{}/{i}",
                    if rest_key == "items" {
                        "prefixItems"
                    } else {
                        "items"
                    }
                ),
                depth + 1,
            )?;
            bytes = bytes.saturating_add(f.bytes);
            if largest.as_ref().is_none_or(|l| f.bytes > l.bytes) {
                largest = Some(f);
            }
            taken += 1;
        }
        let left = min - taken;
        let mut rest_floor = None;
        if left > 0 {
            let f = match rest {
                Some(schema) => self.floor(schema, &format!("{at}/{rest_key}"), depth + 1)?,
                None => Floor::of(1),
            };
            bytes = bytes.saturating_add(left.saturating_mul(f.bytes));
            rest_floor = Some(f);
        }
        let inner: Vec<Cause> = match (rest_floor, largest) {
            (Some(r), _) if r.bytes > 1 => r.causes,
            (_, Some(l)) => l.causes,
            _ => Vec::new(),
        };
        Some(Floor::of(bytes).because(
            Cause {
                keyword: "minItems",
                value: min,
                at: at.to_string(),
            },
            &inner,
        ))
    }

    fn object_floor(
        &mut self,
        map: &'a Map<String, Value>,
        at: &str,
        depth: usize,
    ) -> Option<Floor> {
        let properties: Option<&'a Map<String, Value>> =
            map.get("properties").and_then(Value::as_object);
        let patterns = map.contains_key("patternProperties");
        let mut names: Vec<&str> = map
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        names.sort_unstable();
        names.dedup();
        let mut bytes: u64 = 2;
        let mut largest: Option<(Floor, String)> = None;
        for name in &names {
            // "name":value
            let key = json_size(*name, usize::MAX).unwrap_or(2) as u64 + 1;
            let value = match properties.and_then(|p| p.get(*name)) {
                Some(schema) => {
                    let here = format!("{at}/properties/{}", escape(name));
                    self.floor(schema, &here, depth + 1)?
                }
                None if !patterns => match map.get("additionalProperties") {
                    Some(schema) => {
                        self.floor(schema, &format!("{at}/additionalProperties"), depth + 1)?
                    }
                    None => Floor::of(1),
                },
                None => Floor::of(1),
            };
            bytes = bytes.saturating_add(key).saturating_add(value.bytes);
            if largest.as_ref().is_none_or(|(l, _)| value.bytes > l.bytes) {
                largest = Some((value, (*name).to_string()));
            }
        }
        let required = names.len() as u64;
        let min = count(map, "minProperties").max(required);
        // Each further property is at least `"":0` (4 bytes, names must differ: more).
        bytes = bytes.saturating_add((min - required).saturating_mul(4));
        bytes = bytes.saturating_add(min.saturating_sub(1));
        let floor = Floor::of(bytes);
        if min > required
            && (min - required).saturating_mul(4) >= largest.as_ref().map_or(0, |(l, _)| l.bytes)
        {
            return Some(floor.because(
                Cause {
                    keyword: "minProperties",
                    value: min,
                    at: at.to_string(),
                },
                &[],
            ));
        }
        Some(match largest {
            Some((l, _)) if !l.causes.is_empty() => Floor {
                bytes,
                causes: l.causes,
            },
            _ => floor,
        })
    }
}

fn string_floor(map: &Map<String, Value>, at: &str) -> Floor {
    let min = count(map, "minLength");
    // Every character is at least one byte, plus the quotes.
    let floor = Floor::of(2u64.saturating_add(min));
    if min == 0 {
        return floor;
    }
    floor.because(
        Cause {
            keyword: "minLength",
            value: min,
            at: at.to_string(),
        },
        &[],
    )
}

/// A non-negative count keyword (`minItems`, `minLength`, …); floats with no fraction
/// count, anything else is 0 (the meta-schema refuses it anyway).
fn count(map: &Map<String, Value>, key: &str) -> u64 {
    match map.get(key) {
        Some(Value::Number(n)) => n.as_u64().unwrap_or_else(|| {
            n.as_f64()
                .filter(|f| f.is_finite() && *f >= 0.0)
                .map_or(0, |f| f as u64)
        }),
        _ => 0,
    }
}

fn resolve<'a>(root: &'a Value, reference: &str) -> Option<&'a Value> {
    let pointer = reference.strip_prefix('#')?;
    if pointer.is_empty() {
        return Some(root);
    }
    root.pointer(pointer)
}

fn escape(segment: &str) -> String {
    segment.replace('~', "~0").replace('/', "~1")
}

#[cfg(test)]
mod tests;

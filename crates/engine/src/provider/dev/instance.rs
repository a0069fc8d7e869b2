//! `extract_data`: the smallest instance a schema allows, built within a byte budget and
//! a time limit.

use super::{Refusal, json_len};
use crate::cpu::Halt;
use serde_json::{Map, Value, json};

/// Deepest schema nesting the instance builder follows.
const MAX_SCHEMA_DEPTH: usize = 32;

/// Builds the smallest instance of a schema, charging every byte it adds to a budget
/// (so it never builds more than the output limit) and checking its halt at every step.
pub(super) struct Builder<'a> {
    pub(super) root: &'a Value,
    /// Bytes the output may still take.
    pub(super) budget: usize,
    pub(super) halt: &'a Halt,
}

impl Builder<'_> {
    /// Takes `bytes` from the budget, or refuses.
    fn charge(&mut self, bytes: usize) -> Result<(), Refusal> {
        if bytes > self.budget {
            return Err(Refusal::TooLarge);
        }
        self.budget -= bytes;
        Ok(())
    }

    fn check(&self) -> Result<(), Refusal> {
        match self.halt.check() {
            Some(stop) => Err(Refusal::Halted(stop)),
            None => Ok(()),
        }
    }

    /// The smallest instance of `schema` (resolved against the root for `$ref`s).
    pub(super) fn instance(&mut self, schema: &Value, depth: usize) -> Result<Value, Refusal> {
        self.check()?;
        if depth > MAX_SCHEMA_DEPTH {
            return Err("the schema nests or refers to itself too deeply"
                .to_string()
                .into());
        }
        let map = match schema {
            Value::Bool(true) => {
                self.charge(4)?;
                return Ok(Value::Null);
            }
            Value::Bool(false) => {
                return Err("the schema `false` accepts no value".to_string().into());
            }
            Value::Object(map) => map,
            _ => {
                return Err("a subschema is neither an object nor a boolean"
                    .to_string()
                    .into());
            }
        };
        if let Some(Value::String(target)) = map.get("$ref") {
            let resolved = resolve_ref(target, self.root)?;
            return self.instance(resolved, depth + 1);
        }
        if let Some(value) = map.get("const") {
            self.charge(json_len(value))?;
            return Ok(value.clone());
        }
        if let Some(Value::Array(options)) = map.get("enum") {
            let first = options
                .first()
                .ok_or_else(|| "an empty `enum` accepts no value".to_string())?;
            self.charge(json_len(first))?;
            return Ok(first.clone());
        }
        if let Some(Value::Array(parts)) = map.get("allOf") {
            let mut merged = map.clone();
            merged.remove("allOf");
            for part in parts {
                let part = match part.get("$ref").and_then(Value::as_str) {
                    Some(target) => resolve_ref(target, self.root)?,
                    None => part,
                };
                merge_into(&mut merged, part);
            }
            return self.instance(&Value::Object(merged), depth + 1);
        }
        for combinator in ["anyOf", "oneOf"] {
            if let Some(Value::Array(options)) = map.get(combinator) {
                let mut last = Refusal::Unsatisfiable(format!("`{combinator}` has no options"));
                let budget = self.budget;
                for option in options {
                    let mut merged = map.clone();
                    merged.remove(combinator);
                    merge_into(&mut merged, option);
                    match self.instance(&Value::Object(merged), depth + 1) {
                        Ok(v) => return Ok(v),
                        Err(Refusal::Halted(stop)) => return Err(Refusal::Halted(stop)),
                        Err(refusal) => {
                            // A refused option's bytes were never used.
                            self.budget = budget;
                            if !matches!(last, Refusal::TooLarge) {
                                last = refusal;
                            }
                        }
                    }
                }
                return Err(last);
            }
        }
        let ty = match map.get("type") {
            Some(Value::String(t)) => t.as_str(),
            // Prefer a non-null type: it says more about the shape.
            Some(Value::Array(types)) => types
                .iter()
                .filter_map(Value::as_str)
                .find(|t| *t != "null")
                .or_else(|| types.iter().filter_map(Value::as_str).next())
                .unwrap_or("null"),
            _ => infer_type(map),
        };
        let value = match ty {
            "null" => Value::Null,
            "boolean" => Value::Bool(false),
            "integer" => number(map, true)?,
            "number" => number(map, false)?,
            "string" => return self.string(map),
            "array" => return self.array(map, depth),
            "object" => return self.object(map, depth),
            other => return Err(format!("unknown type `{other}`").into()),
        };
        self.charge(json_len(&value))?;
        Ok(value)
    }

    fn string(&mut self, map: &Map<String, Value>) -> Result<Value, Refusal> {
        let mut text = match map.get("format").and_then(Value::as_str) {
            Some("date-time") => "2024-01-01T00:00:00Z",
            Some("date") => "2024-01-01",
            Some("time") => "00:00:00Z",
            Some("duration") => "P1D",
            Some("email" | "idn-email") => "dev@example.com",
            Some("hostname" | "idn-hostname") => "example.com",
            Some("ipv4") => "127.0.0.1",
            Some("ipv6") => "::1",
            Some("uri" | "iri" | "url") => "https://example.com/",
            Some("uri-reference" | "iri-reference") => "/",
            Some("uuid") => "00000000-0000-4000-8000-000000000000",
            Some("json-pointer") => "",
            Some("regex") => ".*",
            _ => "",
        }
        .to_string();
        let min = map
            .get("minLength")
            .and_then(Value::as_u64)
            .map_or(0, |n| usize::try_from(n).unwrap_or(usize::MAX));
        // The examples are ASCII: one byte per character. Counted once, padded at once
        // (linear in the length), and charged before anything is allocated.
        let have = text.len();
        let pad = min.saturating_sub(have);
        self.charge(have.saturating_add(pad).saturating_add(2))?;
        text.extend(std::iter::repeat_n('x', pad));
        if let Some(max) = map.get("maxLength").and_then(Value::as_u64)
            && text.len() as u64 > max
        {
            return Err(format!("cannot fit an example into maxLength {max}").into());
        }
        Ok(Value::String(text))
    }

    fn array(&mut self, map: &Map<String, Value>, depth: usize) -> Result<Value, Refusal> {
        let min = map
            .get("minItems")
            .and_then(Value::as_u64)
            .map_or(0, |n| usize::try_from(n).unwrap_or(usize::MAX));
        // Brackets and commas.
        self.charge(2usize.saturating_add(min.saturating_sub(1)))?;
        // Every element takes at least one byte: refuse an impossible count before
        // reserving anything.
        if min > self.budget {
            return Err(Refusal::TooLarge);
        }
        let mut items = Vec::with_capacity(min);
        if let Some(Value::Array(prefix)) = map.get("prefixItems") {
            for schema in prefix.iter().take(min) {
                items.push(self.instance(schema, depth + 1)?);
            }
        }
        if items.len() < min {
            // The builder is deterministic: build the repeated element once, then copy
            // it, charging each copy.
            let schema = map.get("items").unwrap_or(&Value::Bool(true));
            let before = self.budget;
            let first = self.instance(schema, depth + 1)?;
            let size = before - self.budget;
            items.push(first.clone());
            while items.len() < min {
                self.check()?;
                self.charge(size)?;
                items.push(first.clone());
            }
        }
        Ok(Value::Array(items))
    }

    fn object(&mut self, map: &Map<String, Value>, depth: usize) -> Result<Value, Refusal> {
        let empty = Map::new();
        let properties = map
            .get("properties")
            .and_then(Value::as_object)
            .unwrap_or(&empty);
        self.charge(2)?;
        let mut out = Map::new();
        for name in map
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
        {
            if out.contains_key(name) {
                continue;
            }
            let schema = properties
                .get(name)
                .or_else(|| map.get("additionalProperties"))
                .unwrap_or(&Value::Bool(true));
            // "name": and a comma.
            self.charge(json_len(&Value::String(name.to_string())) + 2)?;
            let value = self.instance(schema, depth + 1).map_err(|e| match e {
                Refusal::Unsatisfiable(reason) => {
                    Refusal::Unsatisfiable(format!("property `{name}`: {reason}"))
                }
                other => other,
            })?;
            out.insert(name.to_string(), value);
        }
        Ok(Value::Object(out))
    }
}

fn infer_type(map: &Map<String, Value>) -> &'static str {
    let has = |keys: &[&str]| keys.iter().any(|k| map.contains_key(*k));
    if has(&[
        "properties",
        "required",
        "additionalProperties",
        "minProperties",
    ]) {
        "object"
    } else if has(&["items", "prefixItems", "minItems", "maxItems"]) {
        "array"
    } else if has(&["minLength", "maxLength", "pattern", "format"]) {
        "string"
    } else if has(&[
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
    ]) {
        "number"
    } else {
        "null"
    }
}

fn resolve_ref<'a>(target: &str, root: &'a Value) -> Result<&'a Value, String> {
    let pointer = target
        .strip_prefix('#')
        .ok_or_else(|| format!("reference `{target}` is not local"))?;
    if pointer.is_empty() {
        return Ok(root);
    }
    root.pointer(pointer)
        .ok_or_else(|| format!("reference `{target}` points nowhere"))
}

/// Adds `part`'s keywords to `into`: properties and required lists are united, other
/// keywords already present win.
fn merge_into(into: &mut Map<String, Value>, part: &Value) {
    let Value::Object(part) = part else { return };
    for (key, value) in part {
        match (key.as_str(), into.get_mut(key), value) {
            ("properties", Some(Value::Object(existing)), Value::Object(more)) => {
                for (k, v) in more {
                    existing.entry(k.clone()).or_insert_with(|| v.clone());
                }
            }
            ("required", Some(Value::Array(existing)), Value::Array(more)) => {
                for v in more {
                    if !existing.contains(v) {
                        existing.push(v.clone());
                    }
                }
            }
            (_, Some(_), _) => {}
            (_, None, _) => {
                into.insert(key.clone(), value.clone());
            }
        }
    }
}

fn number(map: &Map<String, Value>, integer: bool) -> Result<Value, String> {
    let get = |k: &str| map.get(k).and_then(Value::as_f64);
    let mut low = get("minimum");
    if let Some(ex) = get("exclusiveMinimum") {
        let above = if integer { ex.floor() + 1.0 } else { ex + 1.0 };
        low = Some(low.map_or(above, |l| l.max(above)));
    }
    let mut high = get("maximum");
    if let Some(ex) = get("exclusiveMaximum") {
        let below = if integer {
            ex.ceil() - 1.0
        } else {
            ex - f64::EPSILON.max(ex.abs() * 1e-9)
        };
        high = Some(high.map_or(below, |h| h.min(below)));
    }
    let mut value = match (low, high) {
        (Some(l), _) => l,
        (None, Some(h)) if h < 0.0 => h,
        _ => 0.0,
    };
    if integer {
        value = value.ceil();
    }
    if let Some(step) = get("multipleOf").filter(|s| *s > 0.0) {
        value = (value / step).ceil() * step;
    }
    if let (Some(l), Some(h)) = (low, high)
        && (l > h || value > h)
    {
        return Err(format!("no number satisfies minimum {l} and maximum {h}"));
    }
    if integer || value.fract() == 0.0 && value.abs() < 9e15 {
        Ok(json!(value as i64))
    } else {
        Ok(json!(value))
    }
}

//! Parsing JSON text without ambiguity: an object that names the same key twice, at any
//! depth, is refused (RFC 8259 leaves its meaning open; most parsers silently keep the
//! last one). Every JSON body the service reads goes through [`parse_unambiguous`].

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};
use std::fmt;

/// Where a value sits in the document, built only when an error names it.
#[derive(Clone, Copy)]
enum Path<'a> {
    Root,
    Key(&'a Path<'a>, &'a str),
    Index(&'a Path<'a>, usize),
}

impl fmt::Display for Path<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Path::Root => Ok(()),
            Path::Key(parent, key) => {
                if matches!(parent, Path::Root) {
                    write!(f, "{key}")
                } else {
                    write!(f, "{parent}.{key}")
                }
            }
            Path::Index(parent, i) => write!(f, "{parent}[{i}]"),
        }
    }
}

struct Unambiguous<'a>(Path<'a>);

impl<'de> DeserializeSeed<'de> for Unambiguous<'_> {
    type Value = Value;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Unambiguous<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Number::from_f64(v).map_or(Value::Null, Value::Number))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(v) = seq.next_element_seed(Unambiguous(Path::Index(&self.0, items.len())))? {
            items.push(v);
        }
        Ok(Value::Array(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut object = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if object.contains_key(&key) {
                return Err(de::Error::custom(format!(
                    "duplicate key {:?} at {}",
                    key,
                    match self.0 {
                        Path::Root => "the top level".to_string(),
                        p => p.to_string(),
                    }
                )));
            }
            let value = map.next_value_seed(Unambiguous(Path::Key(&self.0, &key)))?;
            object.insert(key, value);
        }
        Ok(Value::Object(object))
    }
}

/// Parses one JSON document, refusing duplicate object keys anywhere (the error names the
/// key and where it is, e.g. `duplicate key "input" at request`). Otherwise the same as
/// `serde_json::from_slice::<Value>` (including its nesting limit).
pub fn parse_unambiguous(bytes: &[u8]) -> Result<Value, serde_json::Error> {
    let mut d = serde_json::Deserializer::from_slice(bytes);
    let value = Unambiguous(Path::Root).deserialize(&mut d)?;
    d.end()?;
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duplicate_keys_are_refused_at_any_depth() {
        for (text, at) in [
            (r#"{"a":1,"a":2}"#, "the top level"),
            (r#"{"request":{"input":"x","input":"y"}}"#, "request"),
            (r#"{"tasks":[{},{"r":{"k":1,"k":1}}]}"#, "tasks[1].r"),
        ] {
            let e = parse_unambiguous(text.as_bytes()).unwrap_err().to_string();
            assert!(e.contains("duplicate key") && e.contains(at), "{text}: {e}");
        }
    }

    #[test]
    fn otherwise_the_same_as_serde_json() {
        for text in [
            r#"{"a":[1,-2,3.5,true,null,"s\u0000"],"b":{"a":{}}}"#,
            "9007199254740993",
            "[]",
            r#"{"x":1e400}"#,
        ] {
            let ours = parse_unambiguous(text.as_bytes()).ok();
            let theirs = serde_json::from_str::<Value>(text).ok();
            assert_eq!(ours, theirs, "{text}");
        }
        assert!(parse_unambiguous(b"{} x").is_err());
        let deep = format!("{}1{}", "[".repeat(200), "]".repeat(200));
        assert!(parse_unambiguous(deep.as_bytes()).is_err());
    }
}

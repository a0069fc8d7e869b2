//! The cost rule for a caller's `extract_data` schema: refused at submit when validating
//! an output against it could take unbounded time. The `jsonschema` validator cannot be
//! interrupted, so a schema whose evaluation is exponential would hold a worker thread
//! for as long as it runs.
//!
//! Validation work is bounded by the size of the schema **with its local `$ref`s
//! expanded** times the size of the value. That expanded size is computed here in one
//! memoized pass (each subschema once, each reference's target counted every time it is
//! reached, saturating at the bound): `anyOf` options that `$ref` the next level, four
//! per level for fifteen levels, are 4^15 subschemas although the document has a few
//! dozen. A recursive schema expands to infinity, but the validator only re-enters it one
//! level deeper in the value (a reference back to itself at the same place of the value is
//! cut), so a reference back to a subschema being expanded counts once. That holds only
//! if each level of the value meets the recursion once: a recursion that comes back to
//! itself by two paths that can land on the same place of the value (`allOf` of two
//! `properties.a` each `$ref: "#"`) doubles the work per level of the value, and is
//! refused too.
//!
//! Plain caps come first: at most [`MAX_SCHEMA_NODES`] subschemas in the document and at
//! most [`MAX_SCHEMA_DEPTH`] levels of nesting; chains of subschemas and `$ref`s deeper
//! than 256 are refused too (they bound the walks' own stack). References are resolved
//! conservatively: a JSON pointer against every resource (`$id`) enclosing the reference,
//! an anchor (`$anchor`, `$dynamicAnchor`, a fragment `$id`) to every subschema carrying
//! it, so renaming a level or wrapping it in a resource does not hide it.
//!
//! The bound, 10,000, leaves room for large hand-written schemas (every schema in
//! Tollgate's own tests other than those probing this rule passes) and is far below what
//! makes validation slow (the fan-out above did not finish in 60 s at 4^15 ≈ 10^9).

use std::collections::{HashMap, HashSet};

use serde_json::{Map, Value};

use crate::error::InvalidInput;

/// Most subschemas a caller's schema may expand to with its `$ref`s followed.
pub const MAX_SCHEMA_EXPANSION: u64 = 10_000;
/// Most subschemas a caller's schema may hold, written out.
pub const MAX_SCHEMA_NODES: usize = 10_000;
/// Deepest nesting of subschemas in a caller's schema, written out.
pub const MAX_SCHEMA_DEPTH: usize = 64;
/// Most paths by which a recursive subschema may come back to itself.
const MAX_RETURN_PATHS: usize = 256;
/// Deepest chain of subschemas and `$ref`s the walks follow (a bound on their stack).
const MAX_WALK_DEPTH: usize = 256;
/// Most steps the search for paths back into recursions takes, over all of them.
const MAX_RETURN_WORK: u64 = 100 * MAX_SCHEMA_EXPANSION;

const FIELD: &str = "request.schema";

/// One step into the value: a property name, an array index, or any key or index.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Step {
    Name(String),
    Index(usize),
    Any,
}

impl Step {
    fn meets(&self, other: &Step) -> bool {
        matches!((self, other), (Step::Any, _) | (_, Step::Any)) || self == other
    }
}

impl std::fmt::Display for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Step::Name(n) => write!(f, "/{n}"),
            Step::Index(i) => write!(f, "/{i}"),
            Step::Any => f.write_str("/*"),
        }
    }
}

/// The subschemas directly under `map`, each with the step it takes into the value
/// (`None`: applied at the same place). `$ref` targets and `$defs` are not children.
fn children(map: &Map<String, Value>) -> Vec<(&Value, Option<Step>)> {
    let mut out = Vec::new();
    for (key, value) in map {
        match (key.as_str(), value) {
            ("not" | "if" | "then" | "else", v) => out.push((v, None)),
            ("allOf" | "anyOf" | "oneOf", Value::Array(vs)) => {
                out.extend(vs.iter().map(|v| (v, None)));
            }
            ("dependentSchemas", Value::Object(m)) => out.extend(m.values().map(|v| (v, None))),
            ("dependencies", Value::Object(m)) => {
                out.extend(m.values().filter(|v| !v.is_array()).map(|v| (v, None)));
            }
            ("properties", Value::Object(m)) => {
                out.extend(m.iter().map(|(k, v)| (v, Some(Step::Name(k.clone())))));
            }
            ("patternProperties", Value::Object(m)) => {
                out.extend(m.values().map(|v| (v, Some(Step::Any))));
            }
            ("prefixItems" | "items", Value::Array(vs)) => {
                out.extend(
                    vs.iter()
                        .enumerate()
                        .map(|(i, v)| (v, Some(Step::Index(i)))),
                );
            }
            (
                "items"
                | "additionalItems"
                | "additionalProperties"
                | "unevaluatedItems"
                | "unevaluatedProperties"
                | "contains"
                | "propertyNames",
                v,
            ) => out.push((v, Some(Step::Any))),
            _ => {}
        }
    }
    out.retain(|(v, _)| v.is_object() || v.is_boolean());
    out
}

/// What the written-out pass learns for resolving references: for every subschema, the
/// resources (`$id`) that enclose it, innermost first, ending with the document; and every
/// anchor by name.
struct Index<'a> {
    /// Enclosing resources of each subschema (by address).
    resources: HashMap<*const Value, Vec<&'a Value>>,
    /// Every resource in the document.
    all_resources: Vec<&'a Value>,
    /// `$anchor`, `$dynamicAnchor` and fragment `$id`s by name.
    anchors: HashMap<&'a str, Vec<&'a Value>>,
}

impl<'a> Index<'a> {
    /// The subschemas a local reference in `node` may designate. A reference is resolved
    /// against every resource enclosing `node` (the validator uses the innermost; counting
    /// all of them can only over-count), an anchor to every subschema carrying it.
    fn targets(&self, node: &'a Value, map: &'a Map<String, Value>) -> Vec<&'a Value> {
        let bases: &[&'a Value] = self
            .resources
            .get(&(node as *const Value))
            .map_or(&self.all_resources, Vec::as_slice);
        let mut out: Vec<&'a Value> = Vec::new();
        for keyword in ["$ref", "$dynamicRef", "$recursiveRef"] {
            let Some(fragment) = map
                .get(keyword)
                .and_then(Value::as_str)
                .and_then(|r| r.strip_prefix('#'))
            else {
                continue;
            };
            if fragment.is_empty() {
                out.extend(bases.iter().copied());
            } else if fragment.starts_with('/') {
                out.extend(bases.iter().filter_map(|b| b.pointer(fragment)));
            } else if let Some(named) = self.anchors.get(fragment) {
                out.extend(named.iter().copied());
            }
        }
        let mut seen = HashSet::new();
        out.retain(|v| seen.insert(*v as *const Value));
        out
    }
}

/// Refuses (`invalid_request` on `request.schema`, naming the reason) a caller's schema
/// whose evaluation could take unbounded time: over [`MAX_SCHEMA_NODES`] subschemas or
/// [`MAX_SCHEMA_DEPTH`] levels written out, over [`MAX_SCHEMA_EXPANSION`] subschemas
/// with its local `$ref`s followed, or a recursion that comes back to itself by two paths
/// able to meet at the same place of the value. The cost of the check is proportional to
/// the schema's size (memoized), never to its expansion.
pub fn check_schema_cost(schema: &Value) -> Result<(), InvalidInput> {
    let index = index(schema)?;
    let mut walk = Expansion {
        index: &index,
        memo: HashMap::new(),
        in_progress: HashSet::new(),
        heads: Vec::new(),
        head_set: HashSet::new(),
        too_deep: false,
    };
    let size = walk.size(schema, 0);
    if walk.too_deep {
        return Err(too_deep());
    }
    if size > MAX_SCHEMA_EXPANSION {
        return Err(too_large());
    }
    let mut work = MAX_RETURN_WORK;
    for head in &walk.heads {
        walk.check_linear(head, &mut work)?;
    }
    Ok(())
}

fn too_large() -> InvalidInput {
    InvalidInput::field(
        FIELD,
        format!(
            "the schema expands to more than {MAX_SCHEMA_EXPANSION} subschemas with its \
             `$ref`s followed: validating a value against it could take too long"
        ),
    )
}

fn too_deep() -> InvalidInput {
    InvalidInput::field(
        FIELD,
        format!(
            "the schema nests subschemas more than {MAX_WALK_DEPTH} levels deep with its \
             `$ref`s followed"
        ),
    )
}

/// The plain caps (subschemas and nesting, written out, iteratively) and the [`Index`].
fn index(schema: &Value) -> Result<Index<'_>, InvalidInput> {
    let mut index = Index {
        resources: HashMap::new(),
        all_resources: vec![schema],
        anchors: HashMap::new(),
    };
    let mut stack: Vec<(&Value, usize, Vec<&Value>)> = vec![(schema, 1, vec![schema])];
    let mut nodes = 0usize;
    while let Some((node, depth, mut bases)) = stack.pop() {
        nodes += 1;
        if nodes > MAX_SCHEMA_NODES {
            return Err(InvalidInput::field(
                FIELD,
                format!("the schema has more than {MAX_SCHEMA_NODES} subschemas"),
            ));
        }
        if depth > MAX_SCHEMA_DEPTH {
            return Err(InvalidInput::field(
                FIELD,
                format!("the schema nests subschemas more than {MAX_SCHEMA_DEPTH} levels deep"),
            ));
        }
        let Value::Object(map) = node else { continue };
        for key in ["$id", "id"] {
            match map.get(key).and_then(Value::as_str) {
                Some(id) if id.starts_with('#') => {
                    index.anchors.entry(&id[1..]).or_default().push(node);
                }
                Some(_) if !std::ptr::eq(node, schema) => {
                    bases.insert(0, node);
                    index.all_resources.push(node);
                }
                _ => {}
            }
        }
        for key in ["$anchor", "$dynamicAnchor"] {
            if let Some(name) = map.get(key).and_then(Value::as_str) {
                index.anchors.entry(name).or_default().push(node);
            }
        }
        let mut next: Vec<&Value> = children(map).into_iter().map(|(c, _)| c).collect();
        for defs in ["$defs", "definitions"] {
            if let Some(Value::Object(m)) = map.get(defs) {
                next.extend(m.values().filter(|v| v.is_object() || v.is_boolean()));
            }
        }
        for child in next {
            stack.push((child, depth + 1, bases.clone()));
        }
        index.resources.insert(node as *const Value, bases);
    }
    Ok(index)
}

struct Expansion<'a> {
    index: &'a Index<'a>,
    memo: HashMap<*const Value, u64>,
    in_progress: HashSet<*const Value>,
    /// Subschemas found referring back to themselves, in the order found, each once.
    heads: Vec<&'a Value>,
    head_set: HashSet<*const Value>,
    /// The walk passed `MAX_WALK_DEPTH`.
    too_deep: bool,
}

impl<'a> Expansion<'a> {
    /// Subschemas under `node` with references followed, at most `MAX_SCHEMA_EXPANSION + 1`;
    /// a reference back to a subschema being expanded counts 1.
    fn size(&mut self, node: &'a Value, depth: usize) -> u64 {
        let key = node as *const Value;
        if let Some(&known) = self.memo.get(&key) {
            return known;
        }
        if self.in_progress.contains(&key) {
            if self.head_set.insert(key) {
                self.heads.push(node);
            }
            return 1;
        }
        let Value::Object(map) = node else {
            return 1;
        };
        if depth > MAX_WALK_DEPTH {
            self.too_deep = true;
            return MAX_SCHEMA_EXPANSION + 1;
        }
        self.in_progress.insert(key);
        let mut total: u64 = 1;
        for (child, _) in children(map) {
            total = total.saturating_add(self.size(child, depth + 1));
            if total > MAX_SCHEMA_EXPANSION {
                break;
            }
        }
        if total <= MAX_SCHEMA_EXPANSION {
            for referred in self.index.targets(node, map) {
                total = total.saturating_add(self.size(referred, depth + 1));
            }
        }
        let total = total.min(MAX_SCHEMA_EXPANSION + 1);
        self.in_progress.remove(&key);
        self.memo.insert(key, total);
        total
    }

    /// Refuses a recursion through `head` that comes back to it by two paths that can meet
    /// at the same place of the value (one's steps a prefix of the other's, `*` meeting
    /// anything). Paths that come back without a step are cut by the validator and do not
    /// count.
    fn check_linear(&self, head: &'a Value, work: &mut u64) -> Result<(), InvalidInput> {
        let mut search = Returns {
            index: self.index,
            head,
            steps: Vec::new(),
            on_stack: vec![head as *const Value],
            paths: Vec::new(),
            work,
        };
        search.from(head)?;
        let paths = search.paths;
        for (i, a) in paths.iter().enumerate() {
            for b in &paths[i + 1..] {
                if a.iter().zip(b).all(|(x, y)| x.meets(y)) {
                    let show = |p: &[Step]| p.iter().map(Step::to_string).collect::<String>();
                    return Err(InvalidInput::field(
                        FIELD,
                        format!(
                            "a recursive part of the schema refers back to itself by two \
                             paths that meet in the value ({} and {}): validating a deep \
                             value against it would take exponential time",
                            show(a),
                            show(b)
                        ),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// The search for the paths (steps into the value) by which a recursion comes back to
/// its head, other recursions on the way cut.
struct Returns<'a, 'w> {
    index: &'a Index<'a>,
    head: &'a Value,
    steps: Vec<Option<Step>>,
    on_stack: Vec<*const Value>,
    paths: Vec<Vec<Step>>,
    work: &'w mut u64,
}

impl<'a> Returns<'a, '_> {
    fn from(&mut self, node: &'a Value) -> Result<(), InvalidInput> {
        *self.work = self.work.checked_sub(1).ok_or_else(too_large)?;
        let Value::Object(map) = node else {
            return Ok(());
        };
        if self.steps.len() + self.on_stack.len() > MAX_WALK_DEPTH {
            return Err(too_deep());
        }
        for (child, step) in children(map) {
            self.steps.push(step);
            let r = self.from(child);
            self.steps.pop();
            r?;
        }
        for referred in self.index.targets(node, map) {
            let key = referred as *const Value;
            if std::ptr::eq(referred, self.head) {
                let path: Vec<Step> = self.steps.iter().flatten().cloned().collect();
                if !path.is_empty() {
                    if self.paths.len() >= MAX_RETURN_PATHS {
                        return Err(too_large());
                    }
                    self.paths.push(path);
                }
            } else if !self.on_stack.contains(&key) {
                self.on_stack.push(key);
                let r = self.from(referred);
                self.on_stack.pop();
                r?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::test_support::arb_json;
    use crate::kinds::{TaskKind, TaskRequest, check_output_fits};
    use crate::task::DEFAULT_MAX_OUTPUT_BYTES;
    use proptest::prelude::*;
    use serde_json::json;

    /// The reason `schema` is refused at submit (parse, then the output rules).
    #[track_caller]
    fn refused(schema: Value) -> String {
        let request = TaskRequest::parse(
            TaskKind::ExtractData,
            &json!({"input": "x", "schema": schema}),
        )
        .expect("the schema itself is valid");
        match check_output_fits(&request, DEFAULT_MAX_OUTPUT_BYTES) {
            Err(InvalidInput::Field { field, reason }) => {
                assert_eq!(field, "request.schema");
                reason
            }
            other => panic!("not refused: {other:?}"),
        }
    }

    #[track_caller]
    fn accepted(schema: Value) {
        let request = TaskRequest::parse(
            TaskKind::ExtractData,
            &json!({"input": "x", "schema": schema}),
        )
        .expect("the schema itself is valid");
        if let Err(e) = check_output_fits(&request, DEFAULT_MAX_OUTPUT_BYTES) {
            panic!("refused: {e}");
        }
    }

    /// `width` options per level, each `$ref`ing the next level, `levels` levels, ending
    /// in `false`.
    fn fan_out(width: usize, levels: usize) -> Value {
        let mut defs = Map::new();
        for i in 0..levels {
            let next = json!({"$ref": format!("#/$defs/d{}", i + 1)});
            defs.insert(format!("d{i}"), json!({"anyOf": vec![next; width]}));
        }
        defs.insert(format!("d{levels}"), json!(false));
        json!({"$defs": defs, "$ref": "#/$defs/d0"})
    }

    #[test]
    fn an_exponential_fan_out_is_refused() {
        // Validating `null` against this did not finish in 60 s.
        let reason = refused(fan_out(4, 15));
        assert!(
            reason.contains("expands to more than 10000 subschemas with its `$ref`s followed"),
            "{reason}"
        );
        // The same through anchors, through `allOf`, and inside a nested resource.
        let mut defs = Map::new();
        for i in 0..15 {
            let next = json!({"$ref": format!("#a{}", i + 1)});
            defs.insert(
                format!("d{i}"),
                json!({"$anchor": format!("a{i}"), "allOf": vec![next; 4]}),
            );
        }
        defs.insert("d15".into(), json!({"$anchor": "a15", "type": "null"}));
        let reason = refused(json!({"$defs": defs, "$ref": "#a0"}));
        assert!(reason.contains("more than 10000 subschemas"), "{reason}");
        let nested = json!({"$defs": {"r": {"$id": "https://example.com/r", "$defs": fan_out(4, 15)["$defs"], "$ref": "#/$defs/d0"}},
                            "$ref": "#/$defs/r"});
        refused(nested);
    }

    #[test]
    fn a_chat_extract_is_held_to_the_same_rules() {
        // `messages` instead of `input`: the schema is checked all the same.
        let chat = |schema: Value| {
            TaskRequest::parse(
                TaskKind::ExtractData,
                &json!({"messages": [{"role": "user", "content": "x"}], "schema": schema}),
            )
            .expect("the schema itself is valid")
        };
        let err = check_output_fits(&chat(fan_out(4, 15)), DEFAULT_MAX_OUTPUT_BYTES).unwrap_err();
        assert!(
            err.to_string().contains("more than 10000 subschemas"),
            "{err}"
        );
        let too_big = json!({"type": "string", "minLength": DEFAULT_MAX_OUTPUT_BYTES + 1});
        assert!(check_output_fits(&chat(too_big), DEFAULT_MAX_OUTPUT_BYTES).is_err());
        assert!(check_output_fits(&chat(fan_out(2, 10)), DEFAULT_MAX_OUTPUT_BYTES).is_ok());
    }

    #[test]
    fn a_fan_out_within_the_bound_is_accepted() {
        // 2^11 paths to the bottom, about 6,000 subschemas expanded.
        accepted(fan_out(2, 10));
        let reason = refused(fan_out(2, 13));
        assert!(reason.contains("more than 10000 subschemas"), "{reason}");
    }

    #[test]
    fn linear_recursion_is_accepted() {
        // A tree node, a binary tree, a linked list through `$defs`, a self-reference in
        // place (cut by the validator).
        accepted(json!({"type": "object", "required": ["name"],
            "properties": {"name": {"type": "string"},
                           "children": {"type": "array", "items": {"$ref": "#"}}}}));
        accepted(json!({"type": "object",
            "properties": {"value": {"type": "number"}, "left": {"$ref": "#"}, "right": {"$ref": "#"}}}));
        accepted(json!({"$defs": {"node": {"type": "object",
                "properties": {"next": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/node"}]}}}},
            "$ref": "#/$defs/node"}));
        accepted(json!({"$ref": "#", "type": "object"}));
        accepted(json!({"anyOf": [{"$ref": "#"}, {"$ref": "#"}, {"$ref": "#"}, {"type": "null"}]}));
    }

    #[test]
    fn recursion_meeting_itself_in_the_value_is_refused() {
        // Each level of `{"a": {"a": …}}` is validated twice per level above it.
        let reason = refused(json!({"type": "object", "allOf": [
            {"properties": {"a": {"$ref": "#"}}},
            {"properties": {"a": {"$ref": "#"}}}]}));
        assert!(
            reason.contains("two paths that meet in the value (/a and /a)"),
            "{reason}"
        );
        // A wildcard meets a name; a shorter path meets a longer one it begins.
        refused(json!({"properties": {"a": {"$ref": "#"}}, "additionalProperties": {"$ref": "#"}}));
        refused(json!({"properties": {"a": {"$ref": "#", "properties": {"b": {"$ref": "#"}}}}}));
    }

    #[test]
    fn a_deep_but_small_schema_is_accepted_up_to_the_depth_cap() {
        let nest = |levels: usize| {
            let mut schema = json!({"type": "string"});
            for _ in 1..levels {
                schema = json!({"type": "object", "properties": {"a": schema}});
            }
            schema
        };
        accepted(nest(MAX_SCHEMA_DEPTH));
        let reason = refused(nest(MAX_SCHEMA_DEPTH + 1));
        assert!(reason.contains("more than 64 levels deep"), "{reason}");
    }

    #[test]
    fn long_reference_chains_are_refused() {
        let chain = |n: usize| {
            let defs: Map<String, Value> = (0..n)
                .map(|i| {
                    (
                        format!("d{i}"),
                        json!({"$ref": format!("#/$defs/d{}", i + 1)}),
                    )
                })
                .chain([(format!("d{n}"), json!({"type": "null"}))])
                .collect();
            json!({"$defs": defs, "$ref": "#/$defs/d0"})
        };
        accepted(chain(200));
        let reason = refused(chain(300));
        assert!(
            reason.contains("more than 256 levels deep with its `$ref`s followed"),
            "{reason}"
        );
    }

    #[test]
    fn the_written_size_is_capped() {
        let properties: Map<String, Value> = (0..MAX_SCHEMA_NODES)
            .map(|i| (format!("p{i}"), json!({})))
            .collect();
        let reason = refused(json!({"type": "object", "properties": properties}));
        assert!(
            reason.contains("has more than 10000 subschemas"),
            "{reason}"
        );
        let properties: Map<String, Value> = (0..MAX_SCHEMA_NODES - 1)
            .map(|i| (format!("p{i}"), json!({})))
            .collect();
        accepted(json!({"type": "object", "properties": properties}));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn the_rule_never_panics(schema in arb_json()) {
            let _ = check_schema_cost(&schema);
        }
    }
}

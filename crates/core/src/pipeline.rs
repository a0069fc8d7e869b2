//! Declarative pipelines: a DAG of AI steps over a workflow run (issue "Workflow runs and
//! durable AI pipelines"). Pure rules only: parsing and validating a definition, the
//! order steps may run in, filling a step's request from the run's input and earlier
//! outputs, and the run's output. The engine drives runs; the store keeps definitions.
//!
//! A definition is JSON:
//!
//! ```json
//! {
//!   "description": "invoice intake",
//!   "steps": [
//!     { "key": "extract", "kind": "extract_data",
//!       "request": { "input": { "$from": "/input/text" },
//!                    "schema": { "type": "object", "required": ["vendor", "total"],
//!                                "properties": { "vendor": { "type": "string" },
//!                                                "total": { "type": "number" } } } },
//!       "source": { "id": { "$from": "/input/invoice_id" }, "revision": "v1" } },
//!     { "key": "category", "kind": "classify", "depends_on": ["extract"],
//!       "request": { "input": { "$from": "/steps/extract/output/vendor" },
//!                    "labels": ["software", "travel", "office"] } },
//!     { "key": "summary", "kind": "generate_text", "depends_on": ["extract", "category"],
//!       "retries": 2,
//!       "request": { "prompt": { "$template": "Summarize: {/steps/extract/output/vendor} ({/steps/category/output/label}), total {/steps/extract/output/total}." } } }
//!   ],
//!   "output": { "vendor": "/steps/extract/output/vendor",
//!               "category": "/steps/category/output/label",
//!               "summary": "/steps/summary/output/text" }
//! }
//! ```
//!
//! Anywhere in a step's `request` or `source`, `{"$from": "<JSON Pointer>"}` is replaced
//! by the value it points at, and `{"$template": "… {<pointer>} …"}` by a string with each
//! `{pointer}` replaced (strings as they are, other values as JSON). Pointers start with
//! `/input` (the run's input) or `/steps/<key>/output` (an earlier step's output, which
//! requires `<key>` among the step's dependencies, directly or through others).

use crate::canonical::hash_value;
use crate::error::InvalidInput;
use crate::ids::{ModelId, StepKey};
use crate::kinds::TaskKind;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::{BTreeMap, BTreeSet};

mod references;

use references::{check_pointer, collect_refs, context};
pub use references::{has_references, resolve};

/// Most steps a pipeline may have.
pub const MAX_STEPS: usize = 100;
/// Most retries a step may ask for.
pub const MAX_RETRIES: u32 = 10;
/// Longest step key in a pipeline, in bytes.
pub const MAX_STEP_KEY_BYTES: usize = 64;

/// A pipeline's step keys are plain names (`A-Z a-z 0-9 _ -`, at most 64 bytes): they
/// appear unescaped in JSON Pointers (`/steps/<key>/output`) and in the effect keys the
/// engine derives for each attempt (`run:<run>:<key>#<n>`), where a `/`, `~`, `:` or `#`
/// would be ambiguous.
pub fn check_step_key(key: &str) -> Result<(), String> {
    if key.is_empty() || key.len() > MAX_STEP_KEY_BYTES {
        return Err(format!(
            "must be 1 to {MAX_STEP_KEY_BYTES} bytes, got {}",
            key.len()
        ));
    }
    if let Some(c) = key
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || *c == '_' || *c == '-'))
    {
        return Err(format!(
            "step key {key:?} may only hold letters, digits, `_` and `-` (found {c:?})"
        ));
    }
    Ok(())
}

/// Longest pipeline name, in bytes.
pub const MAX_PIPELINE_NAME_BYTES: usize = 128;

/// A pipeline's name is registered as a plain name (`A-Z a-z 0-9 _ - .`, at most 128
/// bytes, not starting with `.`): it appears in URL paths (`/v1/pipelines/<name>`) and
/// on command lines unescaped.
pub fn check_pipeline_name(name: &str) -> Result<(), InvalidInput> {
    if name.is_empty() || name.len() > MAX_PIPELINE_NAME_BYTES {
        return Err(err(
            "name",
            format!(
                "must be 1 to {MAX_PIPELINE_NAME_BYTES} bytes, got {}",
                name.len()
            ),
        ));
    }
    if name.starts_with('.') {
        return Err(err("name", "must not start with `.`"));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')))
    {
        return Err(err(
            "name",
            format!(
                "pipeline name {name:?} may only hold letters, digits, `_`, `-` and `.` (found {c:?})"
            ),
        ));
    }
    Ok(())
}

/// A step as written in a definition.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepDefinition {
    /// The step's key, unique in the pipeline.
    pub key: String,
    /// The task kind.
    pub kind: String,
    /// Model id (default: the configured default model).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The request, with `$from`/`$template` references.
    pub request: Value,
    /// Binds the step to a source, so admission and the cache apply:
    /// `{"id": …, "revision": …, "recompute"?: bool}` (values may be references).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<Value>,
    /// Budget policy name for the step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<String>,
    /// docs/conformance.md#priority: the priority of the step's tasks within their scope (0–9; default 5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i64>,
    /// Steps whose outputs this one needs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub depends_on: Vec<String>,
    /// How many times a failed step is tried again before the run fails.
    #[serde(default)]
    pub retries: u32,
}

/// A pipeline definition as written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PipelineDefinition {
    /// What the pipeline is for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The steps.
    pub steps: Vec<StepDefinition>,
    /// The run's output: name → JSON Pointer (`/steps/<key>/output…` or `/input…`).
    pub output: BTreeMap<String, String>,
}

/// A validated step.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// Key.
    pub key: StepKey,
    /// Kind.
    pub kind: TaskKind,
    /// Model id.
    pub model: Option<ModelId>,
    /// Request template.
    pub request: Value,
    /// Source template.
    pub source: Option<Value>,
    /// Budget policy.
    pub budget: Option<String>,
    /// docs/conformance.md#priority priority of its tasks.
    pub priority: Option<crate::dispatch::Priority>,
    /// Direct dependencies.
    pub depends_on: Vec<StepKey>,
    /// Retries after a failure.
    pub retries: u32,
}

/// A validated pipeline: steps in a topological order, references checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Pipeline {
    /// Steps, each after all of its dependencies.
    pub steps: Vec<Step>,
    /// Output name → pointer.
    pub output: BTreeMap<String, String>,
    /// The definition as given (normalized), what is stored.
    pub definition: Value,
    /// SHA-256 of the canonical definition: the version.
    pub version: String,
}

fn err(field: impl Into<String>, reason: impl Into<String>) -> InvalidInput {
    InvalidInput::field(field, reason)
}

impl Pipeline {
    /// Parses and validates a definition; every problem names where it is.
    pub fn parse(definition: &Value) -> Result<Pipeline, InvalidInput> {
        // A step's shape error names the step (serde's own message names only the field).
        if let Some(steps) = definition.get("steps").and_then(Value::as_array) {
            for (i, step) in steps.iter().enumerate() {
                if let Err(e) = serde_json::from_value::<StepDefinition>(step.clone()) {
                    let key = step.get("key").and_then(Value::as_str);
                    let at = match key {
                        Some(k) => format!("definition.steps[{i}] ({k})"),
                        None => format!("definition.steps[{i}]"),
                    };
                    return Err(err(at, e.to_string()));
                }
            }
        }
        let def: PipelineDefinition = serde_json::from_value(definition.clone())
            .map_err(|e| err("definition", e.to_string()))?;
        if def.steps.is_empty() {
            return Err(err(
                "definition.steps",
                "a pipeline needs at least one step",
            ));
        }
        if def.steps.len() > MAX_STEPS {
            return Err(err(
                "definition.steps",
                format!("at most {MAX_STEPS} steps, got {}", def.steps.len()),
            ));
        }
        let mut keys = BTreeMap::new();
        for (i, s) in def.steps.iter().enumerate() {
            check_step_key(&s.key).map_err(|e| err(format!("definition.steps[{i}].key"), e))?;
            let key = StepKey::new(s.key.clone())
                .map_err(|e| err(format!("definition.steps[{i}].key"), e.to_string()))?;
            if keys.insert(key.clone(), i).is_some() {
                return Err(err(
                    format!("definition.steps[{i}].key"),
                    format!("step `{key}` is defined twice"),
                ));
            }
        }
        let mut steps = Vec::new();
        for (i, s) in def.steps.iter().enumerate() {
            let at = format!("definition.steps[{i}] ({})", s.key);
            let kind = TaskKind::parse(&s.kind).ok_or_else(|| {
                err(
                    format!("{at}.kind"),
                    format!(
                        "unknown kind {:?}: use generate_text, classify, classify_many, extract_data or embed",
                        s.kind
                    ),
                )
            })?;
            if !s.request.is_object() {
                return Err(err(format!("{at}.request"), "must be an object"));
            }
            if s.retries > MAX_RETRIES {
                return Err(err(
                    format!("{at}.retries"),
                    format!("at most {MAX_RETRIES}, got {}", s.retries),
                ));
            }
            let mut depends_on = Vec::new();
            for (j, d) in s.depends_on.iter().enumerate() {
                let dk = StepKey::new(d.clone())
                    .map_err(|e| err(format!("{at}.depends_on[{j}]"), e.to_string()))?;
                if !keys.contains_key(&dk) {
                    return Err(err(
                        format!("{at}.depends_on[{j}]"),
                        format!("unknown step `{d}`"),
                    ));
                }
                if dk.as_str() == s.key {
                    return Err(err(
                        format!("{at}.depends_on[{j}]"),
                        "a step cannot depend on itself",
                    ));
                }
                depends_on.push(dk);
            }
            if let Some(src) = &s.source {
                let ok = src.as_object().is_some_and(|m| {
                    m.contains_key("id")
                        && m.contains_key("revision")
                        && m.keys()
                            .all(|k| ["id", "revision", "recompute"].contains(&k.as_str()))
                });
                if !ok {
                    return Err(err(
                        format!("{at}.source"),
                        "must be {\"id\": …, \"revision\": …, \"recompute\"?: bool}",
                    ));
                }
            }
            steps.push(Step {
                key: StepKey::new(s.key.clone()).map_err(|e| err(&at, e.to_string()))?,
                kind,
                model: s
                    .model
                    .clone()
                    .map(ModelId::new)
                    .transpose()
                    .map_err(|e| err(format!("{at}.model"), e.to_string()))?,
                request: s.request.clone(),
                source: s.source.clone(),
                budget: s.budget.clone(),
                priority: s
                    .priority
                    .map(crate::dispatch::Priority::new)
                    .transpose()
                    .map_err(|e| err(format!("{at}.priority"), e.to_string()))?,
                depends_on,
                retries: s.retries,
            });
        }
        let order = topological_order(&steps)?;
        let steps: Vec<Step> = order.into_iter().map(|i| steps[i].clone()).collect();
        // Every reference must point at the input or at an ancestor's output.
        let ancestors = ancestors(&steps);
        for (i, s) in steps.iter().enumerate() {
            let at = format!("definition.steps ({})", s.key);
            let mut refs = Vec::new();
            collect_refs(&s.request, &format!("{at}.request"), &mut refs)?;
            if let Some(src) = &s.source {
                collect_refs(src, &format!("{at}.source"), &mut refs)?;
            }
            for (where_, pointer) in refs {
                check_pointer(&pointer, &where_, Some(&ancestors[i]), &keys)?;
            }
        }
        if def.output.is_empty() {
            return Err(err("definition.output", "name at least one output"));
        }
        let all: BTreeSet<StepKey> = keys.keys().cloned().collect();
        for (name, pointer) in &def.output {
            check_pointer(
                pointer,
                &format!("definition.output.{name}"),
                Some(&all),
                &keys,
            )?;
        }
        let normalized =
            serde_json::to_value(&def).map_err(|e| err("definition", e.to_string()))?;
        let version = hash_value(&normalized).map_err(|e| e.within("definition"))?;
        Ok(Pipeline {
            steps,
            output: def.output,
            definition: normalized,
            version,
        })
    }

    /// The step with this key.
    pub fn step(&self, key: &StepKey) -> Option<&Step> {
        self.steps.iter().find(|s| &s.key == key)
    }

    /// Checks that a run's input holds everything the definition reads from it (every
    /// `/input…` reference of every step and of the output), so a run that could never
    /// finish is refused when it is started rather than failing halfway.
    pub fn check_input(&self, input: &Value) -> Result<(), InvalidInput> {
        let scope = serde_json::json!({ "input": input });
        // (who reads, where in it, pointer)
        let mut refs: Vec<(String, String, String)> = Vec::new();
        for s in &self.steps {
            let mut found = Vec::new();
            collect_refs(&s.request, "request", &mut found)?;
            if let Some(src) = &s.source {
                collect_refs(src, "source", &mut found)?;
            }
            refs.extend(
                found
                    .into_iter()
                    .map(|(at, pointer)| (format!("step `{}`", s.key), at, pointer)),
            );
        }
        for (name, pointer) in &self.output {
            refs.push((format!("output `{name}`"), String::new(), pointer.clone()));
        }
        for (who, at, pointer) in refs {
            let reads_input = pointer == "/input" || pointer.starts_with("/input/");
            if reads_input && scope.pointer(&pointer).is_none() {
                let place = if at.is_empty() {
                    String::new()
                } else {
                    format!(" (in {at})")
                };
                return Err(err(
                    "input",
                    format!("{who} reads {pointer}{place}, which the input does not have"),
                ));
            }
        }
        Ok(())
    }

    /// The run's output from its input and every step's output.
    pub fn output(
        &self,
        input: &Value,
        outputs: &BTreeMap<StepKey, Value>,
    ) -> Result<Value, String> {
        let scope = context(input, outputs);
        let mut out = Map::new();
        for (name, pointer) in &self.output {
            let v = scope
                .pointer(pointer)
                .cloned()
                .ok_or_else(|| format!("output `{name}`: nothing at {pointer}"))?;
            out.insert(name.clone(), v);
        }
        Ok(Value::Object(out))
    }
}

/// Kahn's algorithm; a cycle is reported with the steps on it.
fn topological_order(steps: &[Step]) -> Result<Vec<usize>, InvalidInput> {
    let mut indegree: Vec<usize> = steps.iter().map(|s| s.depends_on.len()).collect();
    let mut ready: Vec<usize> = (0..steps.len()).filter(|&i| indegree[i] == 0).collect();
    ready.reverse();
    let mut order = Vec::new();
    while let Some(i) = ready.pop() {
        order.push(i);
        for (j, s) in steps.iter().enumerate() {
            if s.depends_on.contains(&steps[i].key) {
                indegree[j] -= 1;
                if indegree[j] == 0 {
                    ready.insert(0, j);
                }
            }
        }
    }
    if order.len() < steps.len() {
        let stuck: Vec<String> = (0..steps.len())
            .filter(|i| !order.contains(i))
            .map(|i| steps[i].key.to_string())
            .collect();
        return Err(err(
            "definition.steps",
            format!("depends_on forms a cycle among: {}", stuck.join(", ")),
        ));
    }
    Ok(order)
}

/// For steps in topological order: each step's transitive dependencies.
fn ancestors(steps: &[Step]) -> Vec<BTreeSet<StepKey>> {
    let mut out: Vec<BTreeSet<StepKey>> = Vec::with_capacity(steps.len());
    for s in steps {
        let mut set = BTreeSet::new();
        for d in &s.depends_on {
            set.insert(d.clone());
            if let Some(j) = steps.iter().position(|x| &x.key == d)
                && j < out.len()
            {
                set.extend(out[j].iter().cloned());
            }
        }
        out.push(set);
    }
    out
}

#[cfg(test)]
mod tests;

use super::*;
use serde_json::json;

fn invoice() -> Value {
    json!({
        "steps": [
            {"key": "summary", "kind": "generate_text", "depends_on": ["extract", "category"],
             "request": {"prompt": {"$template": "Vendor {/steps/extract/output/vendor} is {/steps/category/output/label}; total {/steps/extract/output/total}."}}},
            {"key": "extract", "kind": "extract_data",
             "request": {"input": {"$from": "/input/text"}, "schema": {"type": "object"}},
             "source": {"id": {"$from": "/input/invoice_id"}, "revision": "v1"}},
            {"key": "category", "kind": "classify", "depends_on": ["extract"],
             "request": {"input": {"$from": "/steps/extract/output/vendor"}, "labels": ["software", "travel"]}}
        ],
        "output": {"summary": "/steps/summary/output/text", "vendor": "/steps/extract/output/vendor"}
    })
}

#[test]
fn steps_come_in_dependency_order_and_resolve() {
    let p = Pipeline::parse(&invoice()).unwrap();
    let order: Vec<&str> = p.steps.iter().map(|s| s.key.as_str()).collect();
    assert_eq!(order, vec!["extract", "category", "summary"]);
    assert_eq!(p.version.len(), 64);
    let input = json!({"text": "ACME invoice", "invoice_id": "inv-7"});
    let mut outputs = BTreeMap::new();
    let extract = p.steps[0].clone();
    assert_eq!(
        resolve(&extract.request, &input, &outputs).unwrap(),
        json!({"input": "ACME invoice", "schema": {"type": "object"}})
    );
    assert_eq!(
        resolve(extract.source.as_ref().unwrap(), &input, &outputs).unwrap(),
        json!({"id": "inv-7", "revision": "v1"})
    );
    outputs.insert(
        StepKey::new("extract").unwrap(),
        json!({"vendor": "ACME", "total": 12.5}),
    );
    outputs.insert(
        StepKey::new("category").unwrap(),
        json!({"label": "software"}),
    );
    assert_eq!(
        resolve(&p.steps[2].request, &input, &outputs).unwrap(),
        json!({"prompt": "Vendor ACME is software; total 12.5."})
    );
    outputs.insert(StepKey::new("summary").unwrap(), json!({"text": "ok"}));
    assert_eq!(
        p.output(&input, &outputs).unwrap(),
        json!({"summary": "ok", "vendor": "ACME"})
    );
}

#[test]
fn invalid_definitions_are_refused_precisely() {
    let mut cyc = invoice();
    cyc["steps"][1]["depends_on"] = json!(["summary"]);
    let e = Pipeline::parse(&cyc).unwrap_err().to_string();
    assert!(e.contains("cycle"), "{e}");
    let mut unknown = invoice();
    unknown["steps"][2]["depends_on"] = json!(["nope"]);
    let e = Pipeline::parse(&unknown).unwrap_err().to_string();
    assert!(e.contains("unknown step `nope`"), "{e}");
    let mut kind = invoice();
    kind["steps"][0]["kind"] = json!("summarize");
    assert!(
        Pipeline::parse(&kind)
            .unwrap_err()
            .to_string()
            .contains("unknown kind")
    );
    let mut not_dep = invoice();
    not_dep["steps"][2]["request"]["input"] = json!({"$from": "/steps/summary/output/text"});
    let e = Pipeline::parse(&not_dep).unwrap_err().to_string();
    assert!(e.contains("not among this step's dependencies"), "{e}");
    let mut bad_ptr = invoice();
    bad_ptr["output"]["x"] = json!("/elsewhere");
    assert!(Pipeline::parse(&bad_ptr).is_err());
    let mut dup = invoice();
    dup["steps"][1]["key"] = json!("summary");
    assert!(
        Pipeline::parse(&dup)
            .unwrap_err()
            .to_string()
            .contains("defined twice")
    );
    assert!(Pipeline::parse(&json!({"steps": [], "output": {}})).is_err());
    assert!(Pipeline::parse(&json!({"steps": [], "output": {}, "extra": 1})).is_err());
    let mut typo = invoice();
    typo["steps"][2]["retry"] = json!(1);
    let e = Pipeline::parse(&typo).unwrap_err().to_string();
    assert!(
        e.contains("definition.steps[2] (category): unknown field `retry`"),
        "{e}"
    );
    let mut no_kind = invoice();
    no_kind["steps"][0].as_object_mut().unwrap().remove("kind");
    let e = Pipeline::parse(&no_kind).unwrap_err().to_string();
    assert!(
        e.contains("definition.steps[0] (summary): missing field `kind`"),
        "{e}"
    );
}

#[test]
fn a_step_may_carry_a_priority_in_range() {
    let mut d = invoice();
    d["steps"][0]["priority"] = json!(8);
    let p = Pipeline::parse(&d).unwrap();
    assert!(
        p.steps
            .iter()
            .any(|s| s.priority.map(|p| p.get()) == Some(8))
    );
    d["steps"][0]["priority"] = json!(12);
    let e = Pipeline::parse(&d).unwrap_err().to_string();
    assert!(e.contains("steps[0]") && e.contains("priority"), "{e}");
}

#[test]
fn references_are_found_anywhere() {
    assert!(!has_references(
        &json!({"input": "x", "labels": ["a", {"k": 1}]})
    ));
    assert!(has_references(&json!({"input": {"$from": "/input/x"}})));
    assert!(has_references(
        &json!({"items": [{"input": {"$template": "{/input/x}"}}]})
    ));
    // A step without a source may name a budget: its USD and token limits apply
    // (docs/budgets.md, "Tasks without a source").
    let mut no_source = invoice();
    no_source["steps"][2]["budget"] = json!("standard");
    assert!(Pipeline::parse(&no_source).is_ok());
}

#[test]
fn step_keys_are_plain_names() {
    for bad in ["a#1", "a/b", "a:b", "a~b", "", "é"] {
        let mut def = invoice();
        def["steps"][1]["key"] = json!(bad);
        let e = Pipeline::parse(&def).unwrap_err().to_string();
        assert!(e.contains("definition.steps[1].key"), "{bad:?}: {e}");
    }
    let long = "k".repeat(MAX_STEP_KEY_BYTES + 1);
    assert!(check_step_key(&long).is_err());
    assert!(check_step_key("extract_v2-b").is_ok());
}

#[test]
fn a_run_input_must_hold_what_the_steps_read() {
    let p = Pipeline::parse(&invoice()).unwrap();
    p.check_input(&json!({"text": "ACME", "invoice_id": "inv-7"}))
        .unwrap();
    let e = p
        .check_input(&json!({"text": "ACME"}))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(
            "step `extract` reads /input/invoice_id (in source.id), which the input does not have"
        ),
        "{e}"
    );
    assert!(p.check_input(&json!("just text")).is_err());
}

#[test]
fn pipeline_names_are_plain() {
    for good in ["invoice", "invoice-intake_v2.1"] {
        check_pipeline_name(good).unwrap();
    }
    for bad in ["", ".hidden", "a/b", "a b", "é", &"n".repeat(129)] {
        let e = check_pipeline_name(bad).unwrap_err().to_string();
        assert!(e.starts_with("invalid name: "), "{bad:?}: {e}");
    }
}

#[test]
fn equal_definitions_share_a_version() {
    let a = Pipeline::parse(&invoice()).unwrap();
    let text = serde_json::to_string(&invoice()).unwrap();
    let b = Pipeline::parse(&serde_json::from_str(&text).unwrap()).unwrap();
    assert_eq!(a.version, b.version);
    let mut changed = invoice();
    changed["steps"][0]["retries"] = json!(1);
    assert_ne!(Pipeline::parse(&changed).unwrap().version, a.version);
}

/// A `chat` step is a step like any other: its request templated from earlier outputs.
#[test]
fn a_chat_step_is_accepted_and_resolves() {
    let p = Pipeline::parse(&json!({
        "steps": [
            {"key": "extract", "kind": "extract_data",
             "request": {"input": {"$from": "/input/text"}, "schema": {"type": "object"}}},
            {"key": "reply", "kind": "chat", "depends_on": ["extract"],
             "request": {"messages": [{"role": "user", "content": {"$template": "Vendor {/steps/extract/output/vendor}?"}}],
                         "tools": [{"type": "function", "function": {"name": "lookup"}}]}}
        ],
        "output": {"reply": "/steps/reply/output/content"}
    }))
    .unwrap();
    let reply = p.steps.iter().find(|s| s.key.as_str() == "reply").unwrap();
    let mut outputs = BTreeMap::new();
    outputs.insert(StepKey::new("extract").unwrap(), json!({"vendor": "ACME"}));
    let request = resolve(&reply.request, &json!({"text": "x"}), &outputs).unwrap();
    assert_eq!(request["messages"][0]["content"], "Vendor ACME?");
    assert!(crate::TaskRequest::parse(crate::TaskKind::Chat, &request).is_ok());
}

use super::*;
use crate::canonical::hash_value;

#[test]
fn messages_are_cut_to_2000_characters() {
    let long = "é".repeat(2_500);
    let cut = truncate_message(&long);
    assert_eq!(cut.chars().count(), 2_000);
    assert_eq!(truncate_message("short"), "short");
    assert_eq!(truncate_message("a\0b"), "a\u{FFFD}b");
}

#[test]
fn status_strings_round_trip() {
    for s in [
        TaskStatus::Queued,
        TaskStatus::Running,
        TaskStatus::Succeeded,
        TaskStatus::Failed,
        TaskStatus::Canceled,
    ] {
        assert_eq!(TaskStatus::parse(s.as_str()), Some(s));
    }
    for s in [
        RunState::Running,
        RunState::Waiting,
        RunState::Succeeded,
        RunState::Failed,
        RunState::Canceled,
    ] {
        assert_eq!(RunState::parse(s.as_str()), Some(s));
    }
}

#[test]
fn validated_request_is_canonical_and_size_limited() {
    let a: Value = serde_json::from_str(r#"{"labels":["spam","ham"],"input":"Win!"}"#).unwrap();
    let b: Value = serde_json::from_str(r#"{"input":"Win!","labels":["spam","ham"]}"#).unwrap();
    let ra = ValidatedRequest::new(TaskKind::Classify, &a, DEFAULT_MAX_REQUEST_BYTES).unwrap();
    let rb = ValidatedRequest::new(TaskKind::Classify, &b, DEFAULT_MAX_REQUEST_BYTES).unwrap();
    assert_eq!(ra.input_hash(), rb.input_hash());
    assert_eq!(
        ra.canonical(),
        r#"{"input":"Win!","kind":"classify","labels":["spam","ham"]}"#
    );
    let exact = ra.canonical().len();
    assert!(ValidatedRequest::new(TaskKind::Classify, &a, exact).is_ok());
    let err = ValidatedRequest::new(TaskKind::Classify, &a, exact - 1).unwrap_err();
    assert_eq!(err.code(), ErrorCode::RequestTooLarge);
    let back = ValidatedRequest::from_stored(ra.value()).unwrap();
    assert_eq!(back.input_hash(), ra.input_hash());
}

/// The cache key splices the request's canonical text into its object: it must equal the
/// hash of the whole object canonicalized at once (the form keys were stored in before),
/// whatever the request's text and the subject hold.
#[test]
fn cache_keys_equal_the_hash_of_the_whole_object() {
    let inputs = [
        "plain",
        "quote \" backslash \\ slash / tab \t newline \n nul \u{0} bell \u{7}",
        "unicode é 漢字 😀 \u{2028} \u{ffff}",
        "x",
    ];
    let subjects = [
        None,
        Some(Subject::new(SubjectKind::User, "u-\"1\"").unwrap()),
        Some(Subject::new(SubjectKind::Service, "svc é").unwrap()),
    ];
    let hash = ConfigHash("0b24".repeat(16));
    for input in inputs {
        let value = json!({"input": input, "labels": ["spam", "ham é \"x\""]});
        let request = ValidatedRequest::new(TaskKind::Classify, &value, 256 * 1024).unwrap();
        for subject in &subjects {
            let source = SourceId::new("doc-é\"1").unwrap();
            let revision = SourceRevision::new("v1/ü").unwrap();
            let whole = json!({
                "source_id": source,
                "source_revision": revision,
                "request": request.value(),
                "model_config_hash": hash,
                "subject": subject,
            });
            assert_eq!(
                cache_key(&source, &revision, &request, &hash, subject.as_ref()),
                hash_value(&whole).unwrap(),
                "input {input:?}, subject {subject:?}"
            );
        }
    }
}

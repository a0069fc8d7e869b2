use super::*;

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

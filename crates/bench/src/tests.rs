use super::*;

#[test]
fn passwords_are_redacted() {
    assert_eq!(
        redact("postgres://u:secret@h:5432/db"),
        "postgres://u:***@h:5432/db"
    );
    assert_eq!(
        redact("postgres://postgres@127.0.0.1/test"),
        "postgres://postgres@127.0.0.1/test"
    );
}

#[test]
fn database_is_replaced_in_the_url() {
    assert_eq!(
        with_database("postgres://u:p@h:5432/test", "b").expect("url"),
        "postgres://u:p@h:5432/b"
    );
    assert_eq!(
        with_database("postgres://h?sslmode=disable", "b").expect("url"),
        "postgres://h/b?sslmode=disable"
    );
}

#[test]
fn quick_sizes_are_smaller() {
    let full = Sizes::resolve(&SizeArgs::default(), false).expect("full");
    let quick = Sizes::resolve(&SizeArgs::default(), true).expect("quick");
    assert!(quick.tasks < full.tasks);
    assert!(quick.duration < full.duration);
    assert!(quick.large_window < full.large_window);
    assert_eq!(full.running, vec![100, 10_000]);
}

#[test]
fn the_peer_scenario_has_its_own_defaults_and_is_not_in_all() {
    let sizes = Sizes::resolve(&SizeArgs::default(), false).expect("sizes");
    assert_eq!((sizes.peer_workers, sizes.peer_rounds), (32, 1));
    assert_eq!(sizes.workers, 8);
    let given = SizeArgs {
        workers: Some(4),
        rounds: Some(3),
        ..SizeArgs::default()
    };
    let sizes = Sizes::resolve(&given, false).expect("sizes");
    assert_eq!((sizes.peer_workers, sizes.peer_rounds), (4, 3));
    assert!(!Scenario::EACH.contains(&Scenario::Peer));
}

#[test]
fn nonsense_sizes_are_refused() {
    let args = SizeArgs {
        large_window: Some(10),
        small_window: Some(100),
        ..SizeArgs::default()
    };
    assert!(Sizes::resolve(&args, false).is_err());
}

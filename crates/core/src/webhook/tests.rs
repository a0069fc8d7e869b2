use super::*;
use std::net::{Ipv4Addr, Ipv6Addr};

/// The Standard Webhooks specification's own example.
const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
const TS: i64 = 1614265330;
const BODY: &[u8] = br#"{"test": 2432232314}"#;
const SIGNATURE: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

#[test]
fn signs_like_the_standard_webhooks_example() {
    let secret = WebhookSecret::parse(SECRET).unwrap();
    assert_eq!(secret.sign(ID, TS, BODY), SIGNATURE);
    assert_eq!(secret.to_text(), SECRET);
}

#[test]
fn verifies_and_refuses() {
    let secret = WebhookSecret::parse(SECRET).unwrap();
    let tol = Duration::from_secs(300);
    assert_eq!(secret.verify(ID, TS, SIGNATURE, BODY, TS + 10, tol), Ok(()));
    // One of several signatures (a rotated secret) is enough.
    let several = format!("v1,AAAA {SIGNATURE}");
    assert_eq!(secret.verify(ID, TS, &several, BODY, TS, tol), Ok(()));
    assert_eq!(
        secret.verify(ID, TS, SIGNATURE, br#"{"test": 1}"#, TS, tol),
        Err(SignatureError::Mismatch)
    );
    assert_eq!(
        secret.verify("msg_other", TS, SIGNATURE, BODY, TS, tol),
        Err(SignatureError::Mismatch)
    );
    assert_eq!(
        secret.verify(ID, TS, SIGNATURE, BODY, TS + 301, tol),
        Err(SignatureError::Timestamp)
    );
}

#[test]
fn secrets_are_checked() {
    assert!(WebhookSecret::parse("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").is_err());
    assert!(WebhookSecret::parse("whsec_!!!").is_err());
    assert!(
        WebhookSecret::parse("whsec_AAAA").is_err(),
        "3 bytes is too short"
    );
    assert!(WebhookSecret::from_bytes(vec![7; 65]).is_err());
    assert!(!format!("{:?}", WebhookSecret::parse(SECRET).unwrap()).contains("MfKQ"));
}

#[test]
fn retries_back_off_and_give_up() {
    let s = RetrySchedule {
        initial: Duration::from_secs(1),
        max_interval: Duration::from_secs(8),
        give_up_after: Duration::from_secs(60),
        jitter: 0.5,
    };
    s.check().unwrap();
    let wait = |n, r| match s.after_failure(n, Duration::ZERO, r) {
        RetryDecision::RetryAfter(w) => w,
        RetryDecision::DeadLetter => panic!("dead"),
    };
    assert_eq!(wait(1, 0.0), Duration::from_secs(1));
    assert_eq!(wait(2, 0.0), Duration::from_secs(2));
    assert_eq!(wait(3, 0.0), Duration::from_secs(4));
    assert_eq!(wait(4, 0.0), Duration::from_secs(8));
    assert_eq!(wait(40, 0.0), Duration::from_secs(8), "capped");
    assert_eq!(
        wait(4, 1.0),
        Duration::from_secs(4),
        "jitter takes off up to half"
    );
    assert!(wait(4, 0.3) < Duration::from_secs(8) && wait(4, 0.3) > Duration::from_secs(4));
    assert_eq!(
        s.after_failure(3, Duration::from_secs(57), 0.0),
        RetryDecision::DeadLetter
    );
    assert_eq!(
        s.after_failure(3, Duration::from_secs(56), 0.0),
        RetryDecision::RetryAfter(Duration::from_secs(4))
    );
    let bad = RetrySchedule {
        jitter: 1.5,
        ..RetrySchedule::default()
    };
    assert!(bad.check().is_err());
    let bad = RetrySchedule {
        initial: Duration::from_secs(10),
        max_interval: Duration::from_secs(1),
        ..RetrySchedule::default()
    };
    assert!(bad.check().is_err());
}

#[test]
fn urls_are_https_unless_allowed() {
    assert_eq!(
        check_endpoint_url("https://hooks.example.com/x", false).unwrap(),
        ("hooks.example.com".to_string(), 443)
    );
    assert!(check_endpoint_url("http://hooks.example.com/x", false).is_err());
    assert_eq!(
        check_endpoint_url("http://127.0.0.1:9000/x", true).unwrap(),
        ("127.0.0.1".to_string(), 9000)
    );
    assert!(check_endpoint_url("ftp://hooks.example.com/", true).is_err());
    assert!(check_endpoint_url("https://user:pw@hooks.example.com/", false).is_err());
    assert!(check_endpoint_url("not a url", false).is_err());
}

#[test]
fn internal_addresses_are_refused_unless_allowed() {
    for ip in [
        IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V4(Ipv4Addr::new(10, 1, 2, 3)),
        IpAddr::V4(Ipv4Addr::new(172, 16, 0, 1)),
        IpAddr::V4(Ipv4Addr::new(192, 168, 1, 1)),
        IpAddr::V4(Ipv4Addr::new(169, 254, 169, 254)),
        IpAddr::V4(Ipv4Addr::new(100, 64, 0, 1)),
        IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        IpAddr::V6(Ipv6Addr::LOCALHOST),
        IpAddr::V6("fd00::1".parse().unwrap()),
        IpAddr::V6("fe80::1".parse().unwrap()),
        IpAddr::V6("::ffff:127.0.0.1".parse().unwrap()),
        IpAddr::V6("::ffff:10.0.0.1".parse().unwrap()),
    ] {
        assert!(is_internal_address(ip), "{ip}");
        assert!(!address_allowed(ip, &[]), "{ip}");
    }
    for ip in [
        IpAddr::V4(Ipv4Addr::new(93, 184, 216, 34)),
        IpAddr::V6("2606:4700::1111".parse().unwrap()),
    ] {
        assert!(!is_internal_address(ip), "{ip}");
        assert!(address_allowed(ip, &[]), "{ip}");
    }
    let allowed: Vec<ipnet::IpNet> = vec!["127.0.0.1/32".parse().unwrap()];
    assert!(address_allowed(IpAddr::V4(Ipv4Addr::LOCALHOST), &allowed));
    assert!(!address_allowed(
        IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2)),
        &allowed
    ));
}

#[test]
fn subscriptions_round_trip() {
    let text = subscription_text(&[
        WebhookEventType::TaskFailed,
        WebhookEventType::TaskSucceeded,
        WebhookEventType::TaskFailed,
    ])
    .unwrap();
    assert_eq!(text, r#"["task.failed","task.succeeded"]"#);
    assert_eq!(
        parse_subscription(&text),
        vec![
            WebhookEventType::TaskFailed,
            WebhookEventType::TaskSucceeded
        ]
    );
    assert!(subscription_text(&[]).is_err());
    assert!(WebhookEventType::parse("task.exploded").is_err());
    for t in WebhookEventType::ALL {
        assert_eq!(WebhookEventType::parse(t.as_str()), Ok(t));
        // The store matches by LIKE: no name may hold a LIKE wildcard.
        assert!(!t.as_str().contains(['_', '%']));
    }
}

#[test]
fn budget_thresholds_are_exact_shares_of_a_limit() {
    use budget::*;
    let t = BudgetThreshold::from_fraction(0.8).unwrap();
    assert_eq!(t, BudgetThreshold::DEFAULT);
    assert_eq!(t.basis_points(), 8_000);
    assert_eq!(t.fraction(), 0.8);
    assert_eq!(
        BudgetThreshold::from_fraction(1.0).unwrap().basis_points(),
        10_000
    );
    assert_eq!(
        BudgetThreshold::from_fraction(0.0001)
            .unwrap()
            .basis_points(),
        1
    );
    assert_eq!(
        BudgetThreshold::from_fraction(0.80006)
            .unwrap()
            .basis_points(),
        8_001,
        "kept to the nearest basis point"
    );
    for bad in [
        0.0,
        -0.5,
        1.01,
        f64::NAN,
        f64::INFINITY,
        0.00005,
        0.000_099_9,
    ] {
        assert!(BudgetThreshold::from_fraction(bad).is_err(), "{bad}");
    }
    // 80 % of 10 USD is reached at 8 USD, not a nano-dollar before.
    let limit = 10_000_000_000u64;
    assert!(!t.reached(7_999_999_999, limit));
    assert!(t.reached(8_000_000_000, limit));
    assert!(t.reached(i64::MAX, u64::MAX / 2), "no overflow");
    let parsed: Vec<BudgetThreshold> = serde_json::from_str("[1.0, 0.5, 0.5]").unwrap();
    let checked = check_thresholds(&parsed).unwrap();
    assert_eq!(thresholds_text(&checked), "[5000,10000]");
    assert_eq!(parse_thresholds("[5000,10000,0,20000]"), checked);
    assert!(check_thresholds(&[]).is_err());
    assert!(serde_json::from_str::<Vec<BudgetThreshold>>("[1.5]").is_err());
    assert_eq!(serde_json::to_string(&checked).unwrap(), "[0.5,1.0]");
}

#[test]
fn a_threshold_is_announced_once_per_24_hours_per_limit() {
    use crate::Timestamp;
    use crate::cost::SPEND_WINDOW_MS;
    use budget::*;
    let w = Timestamp(1_767_225_600_000);
    assert!(due_again(None, w));
    assert!(!due_again(Some(w.0), w));
    assert!(!due_again(Some(w.0), Timestamp(w.0 + SPEND_WINDOW_MS - 1)));
    assert!(due_again(Some(w.0), Timestamp(w.0 + SPEND_WINDOW_MS)));
    // The window starts at the hour of now − 24 h.
    assert_eq!(window_start(Timestamp(w.0 + SPEND_WINDOW_MS + 1_234)), w);
    let limit = BudgetLimit {
        app: "acme".into(),
        kind: BudgetLimitKind::ScopeUsd,
        scope: "s".into(),
        limit_nano: 10,
    };
    let id = limit.event_id(BudgetThreshold::DEFAULT, w);
    assert_eq!(id, limit.event_id(BudgetThreshold::DEFAULT, w), "stable");
    assert!(id.starts_with("evt_budget_") && id.len() == "evt_budget_".len() + 32);
    let other_scope = BudgetLimit {
        scope: "t".into(),
        ..limit.clone()
    };
    assert_ne!(id, other_scope.event_id(BudgetThreshold::DEFAULT, w));
    assert_ne!(
        id,
        limit.event_id(BudgetThreshold::DEFAULT, Timestamp(w.0 + 1))
    );
    let data = limit.event_data(BudgetThreshold::DEFAULT, w, 8);
    assert_eq!(data["limit"], "scope_usd_per_24_hours");
    assert_eq!(data["threshold"], 0.8);
    assert_eq!(data["app"], "acme");
    assert_eq!(data["limit_usd"], 1e-8);
}

//! docs/webhooks.md, "Budget thresholds": a settlement that moves a scope's or the app's
//! settled spend in the 24 h window to a share of its USD limit writes one
//! `budget.threshold` event in its transaction, at most once per (limit, threshold) per
//! 24 h, exactly once however many replicas settle at once.

use crate::Backend;
use crate::cost::{cost_budget, priced_task, reserve, tokens};
use crate::fixtures::*;
use std::collections::BTreeMap;
use tollgate_core::webhook::budget::BudgetThreshold;
use tollgate_core::webhook::{WebhookEvent, WebhookEventType};
use tollgate_core::{AppId, Clock, TaskId, WorkerId};
use tollgate_store::Store;
use tollgate_store::webhooks::{DeliveryQuery, NewWebhookEndpoint};

fn listener(id: &str, events: &[WebhookEventType], thresholds: &[f64]) -> NewWebhookEndpoint {
    NewWebhookEndpoint {
        id: id.to_string(),
        app: app("acme"),
        url: format!("https://hooks.example.com/{id}"),
        secret: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".to_string(),
        events: events.to_vec(),
        budget_thresholds: thresholds
            .iter()
            .map(|t| BudgetThreshold::from_fraction(*t).expect("a threshold"))
            .collect(),
        enabled: true,
        description: None,
        from_config: false,
    }
}

/// The app's budget events.
async fn budget_events(s: &dyn Store, app_id: &AppId) -> Vec<WebhookEvent> {
    let mut events: Vec<WebhookEvent> = s
        .list_webhook_events(app_id, 1000)
        .await
        .expect("list_webhook_events")
        .into_iter()
        .filter(|e| e.event_type == WebhookEventType::BudgetThreshold)
        .collect();
    // Events of one settlement share their time: then by limit and threshold.
    events.sort_by_key(|e| {
        let (limit, _, t) = what(e);
        (e.created_at, limit, (t * 10_000.0) as u32)
    });
    events
}

/// (limit, scope, threshold) of an event.
fn what(e: &WebhookEvent) -> (String, Option<String>, f64) {
    let data = e.data.as_ref().expect("a budget event has data");
    (
        data["limit"].as_str().expect("limit").to_string(),
        e.scope.clone(),
        data["threshold"].as_f64().expect("threshold"),
    )
}

/// Claims, then completes a priced task with usage worth 200,000 nano-dollars.
async fn spend(s: &dyn Store, id: TaskId, w: &WorkerId) {
    claim(s, id, w).await;
    let t = s
        .complete_task(id, &lease(w, 1), spam(), tokens(100, 50))
        .await
        .expect("complete_task");
    assert!(t.applied);
}

/// docs/webhooks.md, "Budget thresholds": each threshold of a listening endpoint is
/// announced by the settlement that reaches it (scope limit and app limit alike), once,
/// with the app, scope, limit, window, threshold, spend and limit in its data, and is
/// delivered only to the endpoints naming that threshold; free or unlimited settlements
/// and other apps write none; a threshold still reached is not announced again within
/// 24 h, and is again in a later window.
pub async fn crossing_a_spend_threshold_writes_one_event(b: &dyn Backend) {
    let s = b.open().await;
    let acme = app("acme");
    let ev = [WebhookEventType::BudgetThreshold];
    for e in [
        listener("whe_half", &ev, &[1.0, 0.5]),
        listener("whe_default", &ev, &[0.8]),
        listener("whe_tasks", &[WebhookEventType::TaskFailed], &[0.5]),
    ] {
        s.create_webhook_endpoint(e).await.expect("endpoint");
    }
    // 5 tasks of 200,000 n$ fill the scope's 1,000,000; the app's limit is 2,000,000.
    let limited = cost_budget(Some(1_000_000), None, Some(2_000_000));
    let w = worker("w");
    let start_window = tollgate_core::webhook::budget::window_start(b.clock().now());
    let mut after = Vec::new();
    for i in 0..5 {
        let t = create_new(
            &*s,
            priced_task(
                "acme",
                "s",
                &format!("t{i}"),
                "doc",
                limited,
                reserve(100, 50),
            ),
        )
        .await;
        spend(&*s, t.id, &w).await;
        after.push(budget_events(&*s, &acme).await.len());
        // Events of later settlements are later.
        b.clock().advance(secs(1));
    }
    // Unlimited and free settlements, and another app, write none.
    let free = create_new(
        &*s,
        priced_task("acme", "s", "free", "doc", limited, reserve(0, 0)),
    )
    .await;
    claim(&*s, free.id, &w).await;
    s.complete_task(free.id, &lease(&w, 1), spam(), tokens(0, 0))
        .await
        .unwrap();
    succeed(
        &*s,
        create_new(&*s, new_app_task("acme", "s", "plain")).await.id,
    )
    .await;
    let other = create_new(
        &*s,
        priced_task("globex", "s", "g", "doc", limited, reserve(100, 50)),
    )
    .await;
    spend(&*s, other.id, &w).await;
    assert!(budget_events(&*s, &app("globex")).await.is_empty());

    let events = budget_events(&*s, &acme).await;
    let scope_limit = "scope_usd_per_24_hours".to_string();
    let app_limit = "app_usd_per_24_hours".to_string();
    let s_scope = Some("s".to_string());
    assert_eq!(
        events.iter().map(what).collect::<Vec<_>>(),
        vec![
            (scope_limit.clone(), s_scope.clone(), 0.5),
            (scope_limit.clone(), s_scope.clone(), 0.8),
            (app_limit.clone(), None, 0.5),
            (scope_limit.clone(), s_scope.clone(), 1.0),
        ],
        "in order of crossing: 600,000 → 0.5, 800,000 → 0.8, 1,000,000 → 1.0 (and the app's 0.5)"
    );
    assert_eq!(
        after,
        vec![0, 0, 1, 2, 4],
        "each written by the settlement that crossed"
    );
    let half = &events[0];
    let data = half.data.clone().unwrap();
    assert_eq!(data["app"], "acme");
    assert_eq!(data["limit_usd"], 0.001);
    assert_eq!(data["spent_usd"], 0.0006);
    assert_eq!(data["window_start"], start_window.to_rfc3339());
    let body = half.body();
    assert_eq!(body["type"], "budget.threshold");
    assert_eq!(body["id"], half.id.as_str());
    assert_eq!(body["data"]["scope"], "s");
    assert_eq!(body["data"]["threshold"], 0.5);
    assert!(body["data"].get("task_id").is_none());

    let deliveries = s
        .list_webhook_deliveries(
            &acme,
            &DeliveryQuery {
                limit: 500,
                ..DeliveryQuery::default()
            },
        )
        .await
        .unwrap();
    let mut per_endpoint: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for d in &deliveries {
        per_endpoint
            .entry(d.endpoint_id.clone())
            .or_default()
            .push(d.event_id.clone());
    }
    assert_eq!(
        per_endpoint.get("whe_half").map(Vec::len),
        Some(3),
        "0.5, app 0.5, 1.0"
    );
    assert_eq!(
        per_endpoint.get("whe_default").map(Vec::len),
        Some(1),
        "0.8"
    );
    assert!(!per_endpoint.contains_key("whe_tasks"));

    // A day later the old spend has left the window: crossing 0.5 again is a new event.
    b.clock().advance(hours(25));
    for i in 0..3 {
        let t = create_new(
            &*s,
            priced_task(
                "acme",
                "s",
                &format!("u{i}"),
                "doc",
                limited,
                reserve(100, 50),
            ),
        )
        .await;
        spend(&*s, t.id, &w).await;
    }
    let events = budget_events(&*s, &acme).await;
    assert_eq!(
        events.len(),
        5,
        "{:?}",
        events.iter().map(what).collect::<Vec<_>>()
    );
    let again = &events[4];
    assert_eq!(what(again), (scope_limit, s_scope, 0.5));
    assert_ne!(again.id, half.id);
    assert_eq!(
        again.data.as_ref().unwrap()["window_start"],
        tollgate_core::webhook::budget::window_start(b.clock().now()).to_rfc3339()
    );
}

/// docs/webhooks.md, "Budget thresholds": 4 store instances (replicas) settle 40 tasks of
/// two scopes at once; every threshold of both scopes' limits and of the app's limit is
/// announced exactly once (none missed, none twice). Three rounds, one app each, so a
/// missed crossing has three chances to show.
pub async fn racing_settlements_announce_each_threshold_once(b: &dyn Backend) {
    let stores = open_stores(b, 4).await;
    for app_name in ["acme", "globex", "initech"] {
        race_one_app(&stores, app_name).await;
    }
}

async fn race_one_app(stores: &[std::sync::Arc<dyn Store>], app_name: &str) {
    let acme = app(app_name);
    let mut endpoint = listener(
        &format!("whe_{app_name}"),
        &[WebhookEventType::BudgetThreshold],
        &[0.25, 0.5, 0.75, 1.0],
    );
    endpoint.app = acme.clone();
    stores[0]
        .create_webhook_endpoint(endpoint)
        .await
        .expect("endpoint");
    // 20 tasks of 200,000 n$ fill each scope's 4,000,000; both fill the app's 8,000,000.
    let limited = cost_budget(Some(4_000_000), None, Some(8_000_000));
    let w = worker("w");
    let mut tasks = Vec::new();
    for i in 0..40 {
        let scope_name = if i % 2 == 0 { "s0" } else { "s1" };
        let t = create_new(
            &*stores[0],
            priced_task(
                app_name,
                scope_name,
                &format!("t{i}"),
                "doc",
                limited,
                reserve(100, 50),
            ),
        )
        .await;
        claim(&*stores[0], t.id, &w).await;
        tasks.push(t.id);
    }
    let mut racers = Vec::new();
    for (n, s) in stores.iter().enumerate() {
        let s = s.clone();
        let mine: Vec<TaskId> = tasks.iter().skip(n).step_by(4).copied().collect();
        let w = w.clone();
        racers.push(tokio::spawn(async move {
            for id in mine {
                let t = s
                    .complete_task(id, &lease(&w, 1), spam(), tokens(100, 50))
                    .await
                    .expect("complete_task");
                assert!(t.applied);
            }
        }));
    }
    for r in racers {
        r.await.expect("racer");
    }
    let events = budget_events(&*stores[0], &acme).await;
    let mut seen: Vec<(String, Option<String>, u16)> = events
        .iter()
        .map(|e| {
            let (limit, scope, t) = what(e);
            let bp = BudgetThreshold::from_fraction(t).unwrap().basis_points();
            (limit, scope, bp)
        })
        .collect();
    seen.sort();
    let mut expect = Vec::new();
    for bp in [2_500, 5_000, 7_500, 10_000] {
        expect.push(("app_usd_per_24_hours".to_string(), None, bp));
        for sc in ["s0", "s1"] {
            expect.push((
                "scope_usd_per_24_hours".to_string(),
                Some(sc.to_string()),
                bp,
            ));
        }
    }
    expect.sort();
    assert_eq!(seen, expect, "each threshold of each limit exactly once");
    for e in &events {
        let data = e.data.as_ref().unwrap();
        let spent = data["spent_usd"].as_f64().unwrap();
        let needed = data["threshold"].as_f64().unwrap() * data["limit_usd"].as_f64().unwrap();
        assert!(
            spent + 1e-12 >= needed,
            "announced at {spent} before {needed}"
        );
    }
    let deliveries = stores[1]
        .list_webhook_deliveries(
            &acme,
            &DeliveryQuery {
                limit: 500,
                ..DeliveryQuery::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(deliveries.len(), 12, "one delivery per event");
}

//! docs/webhooks.md: the outbox (an event is written with the terminal move it reports,
//! exactly one per move, only when an endpoint of the app subscribes to it), the
//! deliveries' leases, retries, dead letters and replays, and endpoints per app.

use crate::Backend;
use crate::fixtures::*;
use serde_json::json;
use std::collections::BTreeMap;
use std::time::Duration;
use tollgate_core::webhook::budget::BudgetThreshold;
use tollgate_core::webhook::{RetrySchedule, WebhookEventType};
use tollgate_core::{AppId, Clock, TaskId};
use tollgate_store::webhooks::{
    AttemptResult, DeliveryQuery, DeliveryState, NewWebhookEndpoint, WebhookEndpointPatch,
};
use tollgate_store::{RunResult, Store, SweepConfig};

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

fn endpoint(app_name: &str, id: &str, events: &[WebhookEventType]) -> NewWebhookEndpoint {
    NewWebhookEndpoint {
        id: id.to_string(),
        app: app(app_name),
        url: format!("https://hooks.example.com/{id}"),
        secret: SECRET.to_string(),
        events: events.to_vec(),
        budget_thresholds: vec![BudgetThreshold::DEFAULT],
        enabled: true,
        description: None,
        from_config: false,
    }
}

async fn add_endpoint(s: &dyn Store, new: NewWebhookEndpoint) {
    s.create_webhook_endpoint(new)
        .await
        .expect("create_webhook_endpoint");
}

/// Event type by task id (or run id), failing if any has two.
async fn events_by_subject(s: &dyn Store, app_id: &AppId) -> BTreeMap<String, WebhookEventType> {
    let events = s
        .list_webhook_events(app_id, 1000)
        .await
        .expect("list_webhook_events");
    let mut by = BTreeMap::new();
    for e in events {
        let subject = e
            .task_id
            .clone()
            .or(e.run_id.clone())
            .expect("an event names its task or run");
        assert!(
            by.insert(subject.clone(), e.event_type).is_none(),
            "two events for {subject}"
        );
    }
    by
}

async fn deliveries(
    s: &dyn Store,
    app_id: &AppId,
) -> Vec<tollgate_store::webhooks::WebhookDelivery> {
    s.list_webhook_deliveries(
        app_id,
        &DeliveryQuery {
            limit: 500,
            ..DeliveryQuery::default()
        },
    )
    .await
    .expect("list_webhook_deliveries")
}

/// docs/webhooks.md, "The outbox": every move of a task to a terminal status — success,
/// failure, cancel, the sweep's queue timeout and interruption — writes exactly one event
/// `task.<status>` with one pending delivery per subscribed endpoint; a refused move
/// writes none, and an app without endpoints gets none.
pub async fn terminal_moves_write_one_event_each(b: &dyn Backend) {
    let s = b.open().await;
    let acme = app("acme");
    add_endpoint(&*s, endpoint("acme", "whe_a", &WebhookEventType::ALL)).await;
    add_endpoint(
        &*s,
        endpoint("acme", "whe_b", &[WebhookEventType::TaskFailed]),
    )
    .await;
    let w = worker("w");
    let ok = succeed(
        &*s,
        create_new(&*s, new_app_task("acme", "s", "ok")).await.id,
    )
    .await;
    let failed = create_new(&*s, new_app_task("acme", "s", "failed")).await;
    claim(&*s, failed.id, &w).await;
    fail(&*s, failed.id, "provider down").await;
    let canceled = create_new(&*s, new_app_task("acme", "s", "canceled")).await;
    cancel(&*s, &acme, canceled.id).await;
    let interrupted = create_new(&*s, new_app_task("acme", "s", "interrupted")).await;
    claim(&*s, interrupted.id, &w).await;
    b.clock().advance(secs(31));
    let timed_out = create_new(&*s, new_app_task("acme", "s", "timed-out")).await;
    b.clock().advance(secs(601));
    sweep_all(&*s, &sweep_config()).await;
    let other = succeed(
        &*s,
        create_new(&*s, new_app_task("globex", "s", "x")).await.id,
    )
    .await;
    // Refused moves: nothing more.
    assert_refused(
        s.fail_task(
            ok.id,
            None,
            tollgate_core::ErrorCode::ProviderError,
            "late",
            None,
        )
        .await,
        "fail after success",
    );
    assert_refused(
        s.complete_task(failed.id, &lease(&w, 1), spam(), usage())
            .await,
        "complete after failure",
    );
    cancel(&*s, &acme, canceled.id).await;

    let by = events_by_subject(&*s, &acme).await;
    let expect: BTreeMap<String, WebhookEventType> = [
        (ok.id, WebhookEventType::TaskSucceeded),
        (failed.id, WebhookEventType::TaskFailed),
        (canceled.id, WebhookEventType::TaskCanceled),
        (interrupted.id, WebhookEventType::TaskFailed),
        (timed_out.id, WebhookEventType::TaskFailed),
    ]
    .into_iter()
    .map(|(id, t): (TaskId, _)| (id.to_string(), t))
    .collect();
    assert_eq!(by, expect, "one event per terminal move");
    assert!(
        events_by_subject(&*s, &app("globex")).await.is_empty(),
        "an app without endpoints has no outbox rows ({})",
        other.id
    );
    let ds = deliveries(&*s, &acme).await;
    assert_eq!(
        ds.len(),
        5 + 3,
        "whe_a gets all five, whe_b the three failures"
    );
    assert!(
        ds.iter()
            .all(|d| d.state == DeliveryState::Pending && d.attempts == 0)
    );
    assert_eq!(ds.iter().filter(|d| d.endpoint_id == "whe_b").count(), 3);
    let events = s.list_webhook_events(&acme, 100).await.unwrap();
    let failed_event = events
        .iter()
        .find(|e| e.task_id.as_deref() == Some(&failed.id.to_string()))
        .unwrap();
    assert_eq!(failed_event.state.as_deref(), Some("failed"));
    assert_eq!(failed_event.error_code.as_deref(), Some("provider_error"));
    assert_eq!(failed_event.scope.as_deref(), Some("s"));
    let body = failed_event.body();
    assert_eq!(body["type"], json!("task.failed"));
    assert_eq!(body["id"], json!(failed_event.id));
    assert_eq!(body["data"]["task_id"], json!(failed.id.to_string()));
}

/// docs/webhooks.md, "The outbox", through a batch of completions (as workers complete):
/// each task whose app has an endpoint listening for `task.succeeded` gets its event and
/// deliveries, whatever else the batch holds; a batch of tasks nobody listens to writes
/// none; and an endpoint added later hears the batches after it.
pub async fn a_batch_of_completions_writes_the_events_listened_for(b: &dyn Backend) {
    let s = b.open().await;
    let w = worker("w");
    add_endpoint(
        &*s,
        endpoint("acme", "whe_a", &[WebhookEventType::TaskSucceeded]),
    )
    .await;
    // globex listens, but not for successes.
    add_endpoint(
        &*s,
        endpoint("globex", "whe_g", &[WebhookEventType::TaskFailed]),
    )
    .await;
    let (s, w) = (&*s, &w);
    let batch = |apps: &'static [(&'static str, &'static str)]| async move {
        let mut items = Vec::new();
        let mut ids = Vec::new();
        for (app_name, key) in apps {
            let t = create_new(s, new_app_task(app_name, "s", key)).await;
            let copy = claim(s, t.id, w).await;
            ids.push((app_name.to_string(), t.id.to_string()));
            items.push(tollgate_store::Completion {
                id: copy.id,
                lease: copy.lease().expect("a claimed copy"),
                output: spam(),
                usage: usage(),
                claimed: Some(std::sync::Arc::new(copy)),
                attempt: None,
            });
        }
        let answers = s.complete_tasks(items).await.expect("complete_tasks");
        assert!(
            answers.iter().all(|a| a.as_ref().is_ok_and(|t| t.applied)),
            "{answers:?}"
        );
        ids
    };
    let events_of = |app_name: &'static str| async move {
        events_by_subject(s, &app(app_name))
            .await
            .into_keys()
            .collect::<std::collections::BTreeSet<String>>()
    };
    let ids_of = |ids: &[(String, String)], app_name: &str| {
        ids.iter()
            .filter(|(a, _)| a == app_name)
            .map(|(_, id)| id.clone())
            .collect::<std::collections::BTreeSet<String>>()
    };

    // Mixed: acme's tasks are heard, globex's and initech's are not.
    let mixed = batch(&[
        ("globex", "g1"),
        ("acme", "a1"),
        ("initech", "i1"),
        ("acme", "a2"),
    ])
    .await;
    assert_eq!(events_of("acme").await, ids_of(&mixed, "acme"));
    assert!(
        events_of("globex").await.is_empty(),
        "globex: not subscribed"
    );
    assert!(
        events_of("initech").await.is_empty(),
        "initech: no endpoint"
    );
    assert_eq!(deliveries(s, &app("acme")).await.len(), 2);

    // Nobody listening: nothing written.
    batch(&[("globex", "g2"), ("initech", "i2")]).await;
    assert!(events_of("globex").await.is_empty());
    assert!(events_of("initech").await.is_empty());

    // Only a listened app: every task heard.
    let alone = batch(&[("acme", "a3"), ("acme", "a4"), ("acme", "a5")]).await;
    let mut acme = ids_of(&mixed, "acme");
    acme.extend(ids_of(&alone, "acme"));
    assert_eq!(events_of("acme").await, acme);

    // An endpoint added later hears the batches after it, not those before.
    add_endpoint(
        s,
        endpoint("initech", "whe_i", &[WebhookEventType::TaskSucceeded]),
    )
    .await;
    let later = batch(&[("globex", "g3"), ("initech", "i3")]).await;
    assert_eq!(events_of("initech").await, ids_of(&later, "initech"));
    assert!(events_of("globex").await.is_empty());
    assert_eq!(deliveries(s, &app("initech")).await.len(), 1);
    assert_eq!(deliveries(s, &app("acme")).await.len(), 5);
}

/// docs/webhooks.md, "Endpoints": an event is written only for the types some enabled
/// endpoint subscribes to; a disabled endpoint gets nothing new.
pub async fn only_subscribed_events_are_written(b: &dyn Backend) {
    let s = b.open().await;
    let acme = app("acme");
    add_endpoint(
        &*s,
        endpoint("acme", "whe_f", &[WebhookEventType::TaskFailed]),
    )
    .await;
    let mut off = endpoint("acme", "whe_off", &WebhookEventType::ALL);
    off.enabled = false;
    add_endpoint(&*s, off).await;
    let ok = succeed(
        &*s,
        create_new(&*s, new_app_task("acme", "s", "ok")).await.id,
    )
    .await;
    let failed = create_new(&*s, new_app_task("acme", "s", "failed")).await;
    fail(&*s, failed.id, "no").await;
    let by = events_by_subject(&*s, &acme).await;
    assert_eq!(by.len(), 1, "only the failure: {by:?} (success {})", ok.id);
    let ds = deliveries(&*s, &acme).await;
    assert_eq!(ds.len(), 1);
    assert_eq!(ds[0].endpoint_id, "whe_f");
}

/// docs/webhooks.md, "The outbox": a run's ending (finish or cancel) writes one
/// `run.finished` event; canceling it again, or a finished run, writes none.
pub async fn run_endings_write_one_event_each(b: &dyn Backend) {
    let s = b.open().await;
    let acme = app("acme");
    add_endpoint(
        &*s,
        endpoint("acme", "whe_r", &[WebhookEventType::RunFinished]),
    )
    .await;
    let done = create_run(&*s, new_run("acme", "s")).await;
    s.finish_run(&acme, done.id, RunResult::Succeeded(json!({"ok": true})))
        .await
        .unwrap();
    let canceled = create_run(&*s, new_run("acme", "s")).await;
    s.request_run_cancel(&acme, canceled.id).await.unwrap();
    s.request_run_cancel(&acme, canceled.id).await.unwrap();
    s.request_run_cancel(&acme, done.id).await.unwrap();
    let open = create_run(&*s, new_run("acme", "s")).await;
    let by = events_by_subject(&*s, &acme).await;
    assert_eq!(
        by,
        [
            (done.id.to_string(), WebhookEventType::RunFinished),
            (canceled.id.to_string(), WebhookEventType::RunFinished),
        ]
        .into_iter()
        .collect(),
        "an open run ({}) has none",
        open.id
    );
    let events = s.list_webhook_events(&acme, 10).await.unwrap();
    let states: Vec<_> = events.iter().map(|e| e.state.clone().unwrap()).collect();
    assert!(states.contains(&"succeeded".to_string()) && states.contains(&"canceled".to_string()));
}

/// docs/webhooks.md, "Delivery": a delivery is leased by one replica at a time, at most
/// `per_app` of one app per lease and none of the skipped apps; an expired lease (its
/// replica died) makes it due again, and the old holder can no longer record it.
pub async fn deliveries_are_leased_by_one_replica_at_a_time(b: &dyn Backend) {
    let stores = open_stores(b, 2).await;
    let (s1, s2) = (&*stores[0], &*stores[1]);
    add_endpoint(s1, endpoint("acme", "whe_a", &WebhookEventType::ALL)).await;
    add_endpoint(s1, endpoint("globex", "whe_g", &WebhookEventType::ALL)).await;
    for i in 0..4 {
        let t = create_new(s1, new_app_task("acme", "s", &format!("a{i}"))).await;
        fail(s1, t.id, "x").await;
    }
    let g = create_new(s1, new_app_task("globex", "s", "g")).await;
    fail(s1, g.id, "x").await;
    let (w1, w2) = (worker("r1"), worker("r2"));
    let lease = secs(30);
    let skip_acme = s1
        .lease_webhook_deliveries(&w1, lease, 10, 10, &[app("acme")])
        .await
        .unwrap();
    assert_eq!(skip_acme.len(), 1, "only globex's");
    assert_eq!(skip_acme[0].delivery.app, app("globex"));
    assert_eq!(skip_acme[0].url, "https://hooks.example.com/whe_g");
    assert_eq!(skip_acme[0].secret, SECRET);
    let (a, bb) = tokio::join!(
        s1.lease_webhook_deliveries(&w1, lease, 10, 3, &[]),
        s2.lease_webhook_deliveries(&w2, lease, 10, 3, &[]),
    );
    let (a, bb) = (a.unwrap(), bb.unwrap());
    assert!(a.len() <= 3 && bb.len() <= 3, "at most 3 of acme per lease");
    let mut ids: Vec<_> = a.iter().chain(&bb).map(|l| l.delivery.id.clone()).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), a.len() + bb.len(), "no delivery leased twice");
    assert!(ids.len() >= 3, "globex's was held, acme's were due");
    let rest = s2
        .lease_webhook_deliveries(&w2, lease, 10, 10, &[])
        .await
        .unwrap();
    assert_eq!(ids.len() + rest.len(), 4, "every acme delivery, once");
    assert!(
        s2.lease_webhook_deliveries(&w2, lease, 10, 10, &[])
            .await
            .unwrap()
            .is_empty()
    );
    b.clock().advance(secs(31));
    let again = s2
        .lease_webhook_deliveries(&w2, lease, 10, 10, &[])
        .await
        .unwrap();
    assert_eq!(again.len(), 5, "expired leases are due again");
    let stolen = &skip_acme[0].delivery.id;
    assert!(
        !s1.record_webhook_attempt(
            stolen,
            &w1,
            AttemptResult::Delivered { code: 200 },
            &RetrySchedule::default(),
            0.0
        )
        .await
        .unwrap(),
        "the old holder's record is refused"
    );
    assert!(
        s2.record_webhook_attempt(
            stolen,
            &w2,
            AttemptResult::Delivered { code: 204 },
            &RetrySchedule::default(),
            0.0
        )
        .await
        .unwrap()
    );
    let d = deliveries(s1, &app("globex")).await;
    assert_eq!(d[0].state, DeliveryState::Delivered);
    assert_eq!(d[0].response_code, Some(204));
    assert_eq!(d[0].attempts, 1);
    assert_eq!(d[0].delivered_at, Some(b.clock().now()));
    for l in again.iter().filter(|l| &l.delivery.id != stolen) {
        assert!(
            s2.release_webhook_delivery(&l.delivery.id, &w2)
                .await
                .unwrap()
        );
    }
    assert_eq!(
        s1.lease_webhook_deliveries(&w1, lease, 10, 10, &[])
            .await
            .unwrap()
            .len(),
        4,
        "released deliveries are due at once; a delivered one never again"
    );
}

/// docs/webhooks.md, "Retries": a failed attempt makes the delivery due again after the
/// schedule's wait; once the schedule's time is up it is dead-lettered. A replay sends
/// the same event (same id) again as a new delivery, due at once.
pub async fn failures_back_off_then_dead_letter_and_replays_resend(b: &dyn Backend) {
    let s = b.open().await;
    let acme = app("acme");
    add_endpoint(&*s, endpoint("acme", "whe_a", &WebhookEventType::ALL)).await;
    let t = create_new(&*s, new_app_task("acme", "s", "t")).await;
    fail(&*s, t.id, "x").await;
    let schedule = RetrySchedule {
        initial: secs(10),
        max_interval: secs(40),
        give_up_after: secs(60),
        jitter: 0.0,
    };
    let w = worker("r");
    let failure = || AttemptResult::Failed {
        code: Some(500),
        error: "HTTP 500".into(),
    };
    let start = b.clock().now();
    let leased = s
        .lease_webhook_deliveries(&w, secs(30), 10, 10, &[])
        .await
        .unwrap();
    let id = leased[0].delivery.id.clone();
    let event_id = leased[0].event.id.clone();
    assert!(
        s.record_webhook_attempt(&id, &w, failure(), &schedule, 0.5)
            .await
            .unwrap()
    );
    let d = &deliveries(&*s, &acme).await[0];
    assert_eq!(
        (d.state, d.attempts, d.next_at),
        (DeliveryState::Pending, 1, start.plus(secs(10)))
    );
    assert_eq!(d.response_code, Some(500));
    assert_eq!(d.last_error.as_deref(), Some("HTTP 500"));
    assert!(
        s.lease_webhook_deliveries(&w, secs(30), 10, 10, &[])
            .await
            .unwrap()
            .is_empty(),
        "not due before its wait"
    );
    b.clock().advance(secs(10));
    s.lease_webhook_deliveries(&w, secs(30), 10, 10, &[])
        .await
        .unwrap();
    s.record_webhook_attempt(&id, &w, failure(), &schedule, 0.0)
        .await
        .unwrap();
    assert_eq!(
        deliveries(&*s, &acme).await[0].next_at,
        start.plus(secs(30)),
        "doubled"
    );
    b.clock().advance(secs(20));
    s.lease_webhook_deliveries(&w, secs(30), 10, 10, &[])
        .await
        .unwrap();
    s.record_webhook_attempt(&id, &w, failure(), &schedule, 0.0)
        .await
        .unwrap();
    let d = &deliveries(&*s, &acme).await[0];
    assert_eq!(
        (d.state, d.attempts),
        (DeliveryState::Dead, 3),
        "30 s + 40 s > 60 s: dead"
    );
    assert!(
        s.lease_webhook_deliveries(&w, secs(30), 10, 10, &[])
            .await
            .unwrap()
            .is_empty()
    );

    assert_eq!(
        s.replay_webhook_delivery(&app("globex"), &id)
            .await
            .unwrap(),
        None
    );
    let replay = s
        .replay_webhook_delivery(&acme, &id)
        .await
        .unwrap()
        .expect("replayed");
    assert_eq!(replay.event_id, event_id);
    assert_eq!(replay.replay_of.as_deref(), Some(id.as_str()));
    assert_eq!((replay.state, replay.attempts), (DeliveryState::Pending, 0));
    let leased = s
        .lease_webhook_deliveries(&w, secs(30), 10, 10, &[])
        .await
        .unwrap();
    assert_eq!(leased.len(), 1);
    assert_eq!(leased[0].event.id, event_id, "the same webhook-id");
    assert_eq!(
        leased[0].event.body(),
        s.list_webhook_events(&acme, 1).await.unwrap()[0].body()
    );
}

/// docs/webhooks.md, "Endpoints": endpoints are per app (another app's behaves as
/// missing), patched field by field, deleted with their deliveries; the configuration
/// file's endpoints are replaced as a whole and never touch the API's.
pub async fn endpoints_are_per_app_and_config_ones_are_synced(b: &dyn Backend) {
    let s = b.open().await;
    let acme = app("acme");
    add_endpoint(
        &*s,
        endpoint("acme", "whe_a", &[WebhookEventType::TaskFailed]),
    )
    .await;
    assert!(
        s.get_webhook_endpoint(&app("globex"), "whe_a")
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        !s.delete_webhook_endpoint(&app("globex"), "whe_a")
            .await
            .unwrap()
    );
    assert!(
        s.update_webhook_endpoint(&app("globex"), "whe_a", WebhookEndpointPatch::default())
            .await
            .unwrap()
            .is_none()
    );
    b.clock().advance(secs(1));
    let patched = s
        .update_webhook_endpoint(
            &acme,
            "whe_a",
            WebhookEndpointPatch {
                enabled: Some(false),
                events: Some(vec![
                    WebhookEventType::TaskSucceeded,
                    WebhookEventType::RunFinished,
                ]),
                description: Some(Some("ops".into())),
                ..WebhookEndpointPatch::default()
            },
        )
        .await
        .unwrap()
        .unwrap();
    assert!(!patched.enabled);
    assert_eq!(
        patched.events,
        vec![
            WebhookEventType::RunFinished,
            WebhookEventType::TaskSucceeded
        ]
    );
    assert_eq!(patched.description.as_deref(), Some("ops"));
    assert_eq!(patched.url, "https://hooks.example.com/whe_a");
    assert_eq!(patched.updated_at, b.clock().now());

    let mut cfg = endpoint("acme", "cfg_acme_main", &WebhookEventType::ALL);
    cfg.from_config = true;
    s.sync_config_webhook_endpoints(vec![cfg.clone()])
        .await
        .unwrap();
    s.sync_config_webhook_endpoints(vec![cfg.clone()])
        .await
        .unwrap();
    let list = s.list_webhook_endpoints(&acme).await.unwrap();
    assert_eq!(list.len(), 2);
    assert!(
        list.iter()
            .any(|e| e.id == "cfg_acme_main" && e.from_config)
    );
    let t = create_new(&*s, new_app_task("acme", "s", "t")).await;
    fail(&*s, t.id, "x").await;
    assert_eq!(
        deliveries(&*s, &acme).await.len(),
        1,
        "to the config endpoint"
    );
    s.sync_config_webhook_endpoints(Vec::new()).await.unwrap();
    let list = s.list_webhook_endpoints(&acme).await.unwrap();
    assert_eq!(list.len(), 1, "the API's endpoint stays");
    assert!(
        deliveries(&*s, &acme).await.is_empty(),
        "deleted with its endpoint"
    );
    assert!(s.delete_webhook_endpoint(&acme, "whe_a").await.unwrap());
    assert!(s.list_webhook_endpoints(&acme).await.unwrap().is_empty());
}

/// docs/webhooks.md, "The outbox": a task created succeeded from the cache (never queued)
/// writes its `task.succeeded` event in its creation's transaction, like a completion; a
/// replay of its effect key writes nothing more. Also through `create_tasks`.
pub async fn cache_hits_write_their_succeeded_event(b: &dyn Backend) {
    let s = b.open().await;
    let acme = app("acme");
    add_endpoint(
        &*s,
        endpoint("acme", "whe_s", &[WebhookEventType::TaskSucceeded]),
    )
    .await;
    let original = create_new(&*s, new_scoped_task("acme", "s", "k1", "doc", unlimited())).await;
    let done = succeed(&*s, original.id).await;
    let hit = create(&*s, new_scoped_task("acme", "s", "k2", "doc", unlimited())).await;
    assert!(hit.created && hit.task.cached(), "a cache hit");
    let replay = create(&*s, new_scoped_task("acme", "s", "k2", "doc", unlimited())).await;
    assert!(!replay.created);
    let batch = s
        .create_tasks(vec![new_scoped_task("acme", "s", "k3", "doc", unlimited())])
        .await
        .expect("create_tasks");
    let batched = batch
        .into_iter()
        .next()
        .expect("one answer")
        .expect("created");
    assert!(batched.task.cached());
    let by = events_by_subject(&*s, &acme).await;
    let expect: BTreeMap<String, WebhookEventType> = [done.id, hit.task.id, batched.task.id]
        .into_iter()
        .map(|id| (id.to_string(), WebhookEventType::TaskSucceeded))
        .collect();
    assert_eq!(by, expect, "the completion and both cache hits, once each");
    let hit_event = s
        .list_webhook_events(&acme, 10)
        .await
        .unwrap()
        .into_iter()
        .find(|e| e.task_id == Some(hit.task.id.to_string()))
        .unwrap();
    assert_eq!(hit_event.state.as_deref(), Some("succeeded"));
    assert_eq!(hit_event.created_at, b.clock().now());
    assert_eq!(deliveries(&*s, &acme).await.len(), 3);
}

/// docs/webhooks.md, "Retention and deletion": the sweep deletes events whose deliveries
/// all ended (delivered or dead) longer than the retention ago, with their deliveries;
/// an event with a pending delivery, or one that ended recently, stays. Deleting an
/// owner's data deletes the events and deliveries of its tasks, and no one else's.
pub async fn ended_events_are_swept_after_the_retention_and_go_with_their_owner(b: &dyn Backend) {
    let s = b.open().await;
    let acme = app("acme");
    add_endpoint(&*s, endpoint("acme", "whe_a", &WebhookEventType::ALL)).await;
    let w = worker("r");
    let mut failed = Vec::new();
    for k in ["delivered", "dead", "pending"] {
        let t = create_new(&*s, new_app_task("acme", "s", k)).await;
        fail(&*s, t.id, "x").await;
        failed.push(t.id);
    }
    let event_of = |id: TaskId| tollgate_core::webhook::terminal_event_id(&id.to_string());
    let leased = s
        .lease_webhook_deliveries(&w, secs(30), 10, 10, &[])
        .await
        .unwrap();
    assert_eq!(leased.len(), 3);
    let no_retries = RetrySchedule {
        initial: secs(1),
        max_interval: secs(1),
        give_up_after: Duration::ZERO,
        jitter: 0.0,
    };
    for l in &leased {
        let result = if l.event.id == event_of(failed[0]) {
            AttemptResult::Delivered { code: 200 }
        } else if l.event.id == event_of(failed[1]) {
            AttemptResult::Failed {
                code: Some(500),
                error: "HTTP 500".into(),
            }
        } else {
            s.release_webhook_delivery(&l.delivery.id, &w)
                .await
                .unwrap();
            continue;
        };
        s.record_webhook_attempt(&l.delivery.id, &w, result, &no_retries, 0.0)
            .await
            .unwrap();
    }
    let states: BTreeMap<String, DeliveryState> = deliveries(&*s, &acme)
        .await
        .into_iter()
        .map(|d| (d.event_id, d.state))
        .collect();
    assert_eq!(states[&event_of(failed[1])], DeliveryState::Dead);
    // An hour's retention: the sweep before it is up deletes nothing.
    let config = SweepConfig {
        retention: hours(1),
        ..sweep_config()
    };
    b.clock().advance(secs(3599));
    assert_eq!(sweep(&*s, &config).await.webhook_events_deleted, 0);
    b.clock().advance(secs(1));
    // A recent event stays too.
    let recent = create_new(&*s, new_app_task("acme", "s", "recent")).await;
    fail(&*s, recent.id, "x").await;
    let report = sweep(&*s, &config).await;
    assert_eq!(
        report.webhook_events_deleted, 2,
        "the delivered and the dead one"
    );
    let left: Vec<String> = s
        .list_webhook_events(&acme, 100)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.id)
        .collect();
    let mut expect = vec![event_of(failed[2]), event_of(recent.id)];
    expect.sort();
    let mut left_sorted = left.clone();
    left_sorted.sort();
    assert_eq!(left_sorted, expect, "pending and recent events stay");
    assert_eq!(
        deliveries(&*s, &acme).await.len(),
        2,
        "deliveries went with their events"
    );

    // Owner deletion: the scope's tasks' events and deliveries go, another scope's stay.
    let gone = create_new(&*s, new_app_task("acme", "gone", "g")).await;
    fail(&*s, gone.id, "x").await;
    let ids = |events: Vec<tollgate_core::webhook::WebhookEvent>| -> Vec<String> {
        events.into_iter().map(|e| e.id).collect()
    };
    assert!(ids(s.list_webhook_events(&acme, 100).await.unwrap()).contains(&event_of(gone.id)));
    s.delete_owner_data(&acme, &scope("gone"), None)
        .await
        .unwrap();
    let after = ids(s.list_webhook_events(&acme, 100).await.unwrap());
    assert!(!after.contains(&event_of(gone.id)));
    assert_eq!(after.len(), 2, "the other scope's events stay");
    assert!(
        deliveries(&*s, &acme)
            .await
            .iter()
            .all(|d| d.event_id != event_of(gone.id))
    );
}

//! docs/conformance.md#create-cache: the result cache.

use super::Backend;
use super::fixtures::*;
use tollgate_core::{Clock, ErrorCode, NewRun, NewTask, Owner, TaskStatus};

/// docs/conformance.md#create-cache: a scoped request whose cache key matches a succeeded task of the same
/// app and scope becomes a new task, created directly `succeeded` with a copy of the
/// output (and `cached_from` naming the original), without admission: it is served even
/// when the budget is exhausted and spends nothing.
pub async fn cache_hit_is_a_new_succeeded_task_with_the_copied_output(b: &dyn Backend) {
    let s = b.open().await;
    let acme = app("acme");
    // Two steps, one source, one task at a time, one token a minute.
    let tight = budget(2, 1, 1, 100, 1, 1);
    let original = create_new(&*s, new_scoped_task("acme", "s", "k1", "doc", tight)).await;
    let done = succeed(&*s, original.id).await;

    // The bucket is empty now: an admission would be refused.
    let hit = create(&*s, new_scoped_task("acme", "s", "k2", "doc", tight)).await;
    assert!(hit.created, "a cache hit is a new task");
    let hit = hit.task;
    assert_ne!(hit.id, original.id);
    assert_eq!(hit.effect_key, key("k2"));
    assert_eq!(hit.status, TaskStatus::Succeeded);
    assert_eq!(hit.cached_from, Some(original.id));
    assert!(hit.cached());
    assert_eq!(hit.output, done.output, "the output is copied");
    assert_eq!(hit.cache_key, done.cache_key);
    assert_eq!(hit.completed_at, Some(b.clock().now()));
    assert_eq!(hit.attempt, 0, "no worker ran it");
    assert_eq!(get(&*s, &acme, hit.id).await, hit);

    // One token refills; two more cache hits must not take it.
    b.clock().advance(secs(60));
    for k in ["k3", "k4"] {
        let again = create_new(&*s, new_scoped_task("acme", "s", k, "doc", tight)).await;
        assert_eq!(again.status, TaskStatus::Succeeded);
    }
    // The second step of the source takes the token: the hits spent no step and no token.
    create_new(
        &*s,
        with_input(
            new_scoped_task("acme", "s", "k5", "doc", tight),
            "second step",
        ),
    )
    .await;
    let r = rejection(
        &*s,
        with_input(
            new_scoped_task("acme", "s", "k6", "doc", budget(3, 1, 5, 100, 1, 1)),
            "third step",
        ),
    )
    .await;
    assert_eq!(
        r.code(),
        ErrorCode::RateLimit,
        "the token went to the second step only"
    );
}

/// docs/conformance.md#create-cache: only a *succeeded* task serves the cache; queued, running, failed and
/// canceled tasks do not.
pub async fn cache_ignores_unfinished_and_unsuccessful_tasks(b: &dyn Backend) {
    let s = b.open().await;
    let acme = app("acme");
    let queued = create_new(&*s, new_scoped_task("acme", "s", "q1", "doc", unlimited())).await;
    let t = create_new(&*s, new_scoped_task("acme", "s", "q2", "doc", unlimited())).await;
    assert_eq!(
        (t.status, t.cached_from),
        (TaskStatus::Queued, None),
        "a queued task is not a cached result"
    );
    claim(&*s, queued.id, &worker("w")).await;
    let t = create_new(&*s, new_scoped_task("acme", "s", "q3", "doc", unlimited())).await;
    assert_eq!(
        (t.status, t.cached_from),
        (TaskStatus::Queued, None),
        "a running task is not a cached result"
    );
    fail(&*s, queued.id, "boom").await;
    cancel(&*s, &acme, t.id).await;
    let t = create_new(&*s, new_scoped_task("acme", "s", "q4", "doc", unlimited())).await;
    assert_eq!(
        (t.status, t.cached_from),
        (TaskStatus::Queued, None),
        "failed and canceled tasks are not cached results"
    );
}

/// docs/conformance.md#create-cache: results never cross apps, scopes or subjects, and a new source
/// revision, another source, another request or another model configuration is new
/// work. Each variation is created after a succeeded original and must be queued.
pub async fn cache_never_crosses_app_scope_subject_revision_or_model_config(b: &dyn Backend) {
    let s = b.open().await;
    let base = || {
        with_subject(
            new_scoped_task("acme", "s", "orig", "doc", unlimited()),
            Some(user("u1")),
        )
    };
    let original = create_new(&*s, base()).await;
    succeed(&*s, original.id).await;
    // Sanity: the same request does hit.
    let hit = create_new(
        &*s,
        NewTask {
            dispatch: tollgate_core::Dispatch::default(),
            effect_key: key("same"),
            ..base()
        },
    )
    .await;
    assert_eq!(
        hit.cached_from,
        Some(original.id),
        "the identical request is served from the cache"
    );

    let mut other_model = base();
    other_model
        .model_ref
        .params
        .insert("temperature".into(), serde_json::json!(0.7));
    let mut other_app = base();
    other_app.owner = Owner::Application {
        app: app("globex"),
        scope: scope("s"),
        subject: Some(user("u1")),
    };
    // (what differs, whether the cache key itself differs: apps and scopes share keys
    // but lookups never cross them)
    let variations: Vec<(&str, bool, NewTask)> = vec![
        ("another app", false, other_app),
        (
            "another scope",
            false,
            with_subject(
                new_scoped_task("acme", "s2", "x", "doc", unlimited()),
                Some(user("u1")),
            ),
        ),
        (
            "another subject",
            true,
            with_subject(base(), Some(user("u2"))),
        ),
        ("no subject", true, with_subject(base(), None)),
        ("another source revision", true, with_revision(base(), "v2")),
        (
            "another source",
            true,
            with_subject(
                new_scoped_task("acme", "s", "x", "doc-2", unlimited()),
                Some(user("u1")),
            ),
        ),
        ("another request", true, with_input(base(), "another input")),
        ("another model configuration", true, other_model),
    ];
    for (i, (what, own_key, mut new)) in variations.into_iter().enumerate() {
        new.effect_key = key(&format!("variation-{i}"));
        let t = create_new(&*s, new).await;
        assert_eq!(
            (t.status, t.cached_from),
            (TaskStatus::Queued, None),
            "{what} must not be served from the cache"
        );
        if own_key {
            assert_ne!(
                t.cache_key, original.cache_key,
                "{what} has its own cache key"
            );
        }
    }
}

/// docs/conformance.md#create-cache, docs/conformance.md#admission: `recompute` skips the cache and is admitted as a new logical
/// step even though its cache key is the same; later cache hits serve the newest success.
pub async fn recompute_skips_the_cache_and_counts_as_a_new_step(b: &dyn Backend) {
    let s = b.open().await;
    let two_steps = budget(2, 1, 10, 100, 100, 100);
    let original = create_new(&*s, new_scoped_task("acme", "s", "k1", "doc", two_steps)).await;
    succeed(&*s, original.id).await;
    b.clock().advance(secs(1));
    let again = create_new(
        &*s,
        recompute(new_scoped_task("acme", "s", "k2", "doc", two_steps)),
    )
    .await;
    assert_eq!(
        (again.status, again.cached_from),
        (TaskStatus::Queued, None),
        "recompute is not served from the cache"
    );
    assert!(again.source.as_ref().is_some_and(|src| src.recompute));
    // The original's step and the recompute are two steps of the source: a third is refused.
    let r = rejection(
        &*s,
        recompute(new_scoped_task("acme", "s", "k3", "doc", two_steps)),
    )
    .await;
    assert_eq!(
        r.code(),
        ErrorCode::SourceBudget,
        "each recompute counts as a new step"
    );

    // The newest success serves later hits.
    let w = worker("w");
    claim(&*s, again.id, &w).await;
    assert!(complete(&*s, again.id, &w, ham()).await.applied);
    b.clock().advance(secs(1));
    let hit = create_new(&*s, new_scoped_task("acme", "s", "k4", "doc", two_steps)).await;
    assert_eq!(
        hit.cached_from,
        Some(again.id),
        "the cache serves the newest succeeded task"
    );
    assert_eq!(hit.output, Some(ham()));
}

/// docs/conformance.md#concepts, docs/conformance.md#create-cache: a run-owned task is cached in its run's scope and for its run's subject,
/// sharing results with the application's tasks there.
pub async fn run_tasks_share_the_cache_of_their_scope_and_subject(b: &dyn Backend) {
    let s = b.open().await;
    let original = create_new(
        &*s,
        with_subject(
            new_scoped_task("acme", "s", "app-task", "doc", unlimited()),
            Some(user("u1")),
        ),
    )
    .await;
    succeed(&*s, original.id).await;

    let run = create_run(
        &*s,
        NewRun {
            trace_parent: None,
            subject: Some(user("u1")),
            ..new_run("acme", "s")
        },
    )
    .await;
    let t = create_new(
        &*s,
        NewTask {
            dispatch: tollgate_core::Dispatch::default(),
            scope: scoped("doc", unlimited()),
            ..new_run_task("acme", run.id, "run-task")
        },
    )
    .await;
    assert_eq!(
        t.cached_from,
        Some(original.id),
        "the run's task is served from its scope's cache"
    );

    let stranger = create_run(
        &*s,
        NewRun {
            trace_parent: None,
            subject: Some(user("u2")),
            ..new_run("acme", "s")
        },
    )
    .await;
    let t = create_new(
        &*s,
        NewTask {
            dispatch: tollgate_core::Dispatch::default(),
            scope: scoped("doc", unlimited()),
            ..new_run_task("acme", stranger.id, "other-run-task")
        },
    )
    .await;
    assert_eq!(
        (t.status, t.cached_from),
        (TaskStatus::Queued, None),
        "another subject's run is not served"
    );
}

//! docs/conformance.md#admission-exact the 24 h window: records count for exactly 24 h, slide out one by one, and
//! sweeps pruning them change no decision.

use crate::Backend;
use crate::fixtures::*;
use std::time::Duration;
use tollgate_core::ErrorCode;
use tollgate_store::SweepConfig;

/// docs/conformance.md#admission: steps and sources count for 24 h only, without any sweep: just before the
/// window ends they still count, just after it they no longer do.
pub async fn admission_window_is_24_hours(b: &dyn Backend) {
    let s = b.open().await;
    let one_step = budget(1, 100, 100, 100, 100, 100);
    let one_source = budget(100, 1, 100, 100, 100, 100);
    let t = create_new(&*s, new_scoped_task("acme", "steps", "s1", "doc", one_step)).await;
    succeed(&*s, t.id).await;
    let t = create_new(
        &*s,
        new_scoped_task("acme", "sources", "d1", "doc-1", one_source),
    )
    .await;
    succeed(&*s, t.id).await;
    let next_step = || {
        with_input(
            new_scoped_task("acme", "steps", "s2", "doc", one_step),
            "another step",
        )
    };
    let next_source = || new_scoped_task("acme", "sources", "d2", "doc-2", one_source);

    b.clock().advance(hours(24) - secs(1));
    assert_eq!(
        rejection(&*s, next_step()).await.code(),
        ErrorCode::SourceBudget,
        "23:59:59 later the step still counts"
    );
    assert_eq!(
        rejection(&*s, next_source()).await.code(),
        ErrorCode::DailyBudget,
        "23:59:59 later the source still counts"
    );
    b.clock().advance(secs(2));
    create_new(&*s, next_step()).await;
    create_new(&*s, next_source()).await;
}

/// docs/conformance.md#admission-exact, docs/conformance.md#constant-admission: the window slides record by record, exactly: each source or step
/// stops counting 24 h after *its latest* admission, not when the oldest record of the
/// scope expires (a trap for backends that keep running counters).
pub async fn admission_window_slides_record_by_record(b: &dyn Backend) {
    window_slides(b, false).await;
}

/// docs/conformance.md#admission, docs/conformance.md#sweep-prune: the same sliding window with a sweep (pruning admission records)
/// after every move of the clock: pruning changes no admission decision.
pub async fn admission_window_slides_the_same_with_sweeps(b: &dyn Backend) {
    window_slides(b, true).await;
}

async fn window_slides(b: &dyn Backend, sweeping: bool) {
    let s = b.open().await;
    // Only pruning: no task may time out here.
    let config = SweepConfig {
        queue_timeout: hours(24 * 365),
        liveness_timeout: hours(24 * 365),
        ..sweep_config()
    };
    let advance = |d: Duration| {
        b.clock().advance(d);
        let s = s.clone();
        let config = config.clone();
        async move {
            if sweeping {
                sweep_all(&*s, &config).await;
            }
        }
    };
    let three_sources = budget(100, 3, 100, 100, 100, 100);
    let src = |k: &str, doc: &str| new_scoped_task("acme", "sources", k, doc, three_sources);
    create_new(&*s, src("a", "doc-a")).await; // T0
    advance(hours(1)).await;
    create_new(&*s, src("b", "doc-b")).await; // T0 + 1 h
    advance(hours(1)).await;
    create_new(&*s, src("c", "doc-c")).await; // T0 + 2 h
    assert_eq!(
        rejection(&*s, src("d", "doc-d")).await.code(),
        ErrorCode::DailyBudget
    );
    advance(hours(22) + secs(1)).await; // T0 + 24 h + 1 s: a is out
    create_new(&*s, src("d", "doc-d")).await;
    assert_eq!(
        rejection(&*s, src("e", "doc-e")).await.code(),
        ErrorCode::DailyBudget,
        "b, c and d count"
    );
    advance(hours(1)).await; // b is out
    create_new(&*s, src("e", "doc-e")).await;
    assert_eq!(
        rejection(&*s, src("f", "doc-f")).await.code(),
        ErrorCode::DailyBudget,
        "c, d and e count"
    );

    // A source admitted again stays seen until 24 h after its latest admission.
    let one_source = budget(100, 1, 100, 100, 100, 100);
    let one = |k: &str, doc: &str, input: &str| {
        with_input(
            new_scoped_task("acme", "renewed", k, doc, one_source),
            input,
        )
    };
    create_new(&*s, one("r1", "doc-r", "step 1")).await; // T1
    advance(hours(12)).await;
    create_new(&*s, one("r2", "doc-r", "step 2")).await; // T1 + 12 h
    advance(hours(12) + secs(1)).await; // the first record is out, the second is not
    assert_eq!(
        rejection(&*s, one("r3", "doc-other", "x")).await.code(),
        ErrorCode::DailyBudget,
        "doc-r is still seen"
    );
    create_new(&*s, one("r4", "doc-r", "step 3")).await;

    // A step asked for again stays counted until 24 h after its latest admission.
    let one_step = budget(1, 100, 100, 100, 100, 100);
    let step_task = |k: &str, input: &str| {
        with_input(new_scoped_task("acme", "steps", k, "doc", one_step), input)
    };
    create_new(&*s, step_task("s1", "the step")).await; // T2
    advance(hours(12)).await;
    create_new(&*s, step_task("s2", "the step")).await; // T2 + 12 h, same logical step
    advance(hours(12) + secs(1)).await;
    assert_eq!(
        rejection(&*s, step_task("s3", "another step")).await.code(),
        ErrorCode::SourceBudget,
        "the step is still counted"
    );
    advance(hours(12)).await;
    create_new(&*s, step_task("s3", "another step")).await;
}

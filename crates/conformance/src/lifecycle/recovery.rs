//! What a restarted or another replica reads back: docs/conformance.md#sweep-recovery recovery listing and kept
//! settings.

use crate::Backend;
use crate::fixtures::*;
use tollgate_core::Task;

/// docs/conformance.md#sweep-recovery recovery: `first_queued` is the oldest queued task (creation time, then
/// id) of any app — not a running or terminal one — and none once nothing is queued.
pub async fn first_queued_is_the_oldest_queued_task(b: &dyn Backend) {
    let s = b.open().await;
    assert_eq!(s.first_queued().await.expect("first_queued"), None);
    let mut tasks = Vec::new();
    for i in 0..7 {
        let app_name = if i % 2 == 0 { "acme" } else { "globex" };
        tasks.push(create_new(&*s, new_app_task(app_name, "s", &format!("k{i}"))).await);
        if i % 3 == 0 {
            b.clock().advance(secs(1));
        }
    }
    tasks.sort_by_key(|t| (t.created_at, t.id));
    let oldest = |tasks: &[Task]| tasks.first().map(|t| t.id);
    assert_eq!(
        s.first_queued().await.expect("first_queued"),
        oldest(&tasks)
    );
    let running = tasks.remove(0);
    claim(&*s, running.id, &worker("w")).await;
    let failed = tasks.remove(0);
    fail(&*s, failed.id, "boom").await;
    let canceled = tasks.remove(0);
    cancel(&*s, &canceled.app, canceled.id).await;
    assert_eq!(
        s.first_queued().await.expect("first_queued"),
        oldest(&tasks),
        "running and terminal tasks are not recovered"
    );
    for t in &tasks {
        claim(&*s, t.id, &worker("w")).await;
    }
    assert_eq!(s.first_queued().await.expect("first_queued"), None);
}

/// A kept setting: the first value written wins, every instance (replica) reads it, and
/// racing first writes agree on one value.
pub async fn kept_settings_keep_the_first_value_across_instances(b: &dyn Backend) {
    let s = b.open().await;
    assert_eq!(s.keep_setting("dev_key", "one").await.expect("keep"), "one");
    assert_eq!(
        s.keep_setting("dev_key", "two").await.expect("keep"),
        "one",
        "the first value stays"
    );
    let other = b.open().await;
    assert_eq!(
        other.keep_setting("dev_key", "three").await.expect("keep"),
        "one"
    );
    assert_eq!(other.keep_setting("other", "x").await.expect("keep"), "x");
    let mut racers = Vec::new();
    for i in 0..8 {
        let s = b.open().await;
        racers.push(tokio::spawn(async move {
            s.keep_setting("raced", &format!("v{i}"))
                .await
                .expect("keep")
        }));
    }
    let mut seen = std::collections::BTreeSet::new();
    for r in racers {
        seen.insert(r.await.expect("racer"));
    }
    assert_eq!(seen.len(), 1, "racing first writes agree: {seen:?}");
}

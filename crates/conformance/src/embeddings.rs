//! docs/conformance.md#embed-item-cache: the embeddings item cache — vectors by item key
//! within one app and scope, the first entry of a key kept, each entry owned by the task
//! that computed it and deleted with it (owner deletion, retention), nothing stored for a
//! task that is gone; a mostly cached task charged for its other items only, and tasks
//! of one grouped call each settling its own share.

use crate::Backend;
use crate::cost::{cost_budget, priced_task, reserve, test_prices, tokens};
use crate::fixtures::*;
use tollgate_core::AttemptOutcome;
use tollgate_store::{AttemptEnd, EmbeddingEntry, Store, SweepConfig};

fn entry(key: &str, x: f32) -> EmbeddingEntry {
    EmbeddingEntry {
        key: key.to_string(),
        vector: vec![x, 1.0 - x, 0.25],
        tokens: 3,
    }
}

fn keys(names: &[&str]) -> Vec<String> {
    names.iter().map(|k| k.to_string()).collect()
}

async fn put(s: &dyn Store, task: tollgate_core::TaskId, entries: &[EmbeddingEntry]) -> u64 {
    s.put_embeddings(task, entries)
        .await
        .expect("put_embeddings")
}

/// docs/conformance.md#embed-item-cache: entries are found by key within their app and
/// scope only; a key stored twice keeps its first vector.
pub async fn embedding_cache_is_per_app_and_scope(b: &dyn Backend) {
    let s = b.open().await;
    let a = create_new(&*s, new_app_task("acme", "s", "a")).await;
    let other = create_new(&*s, new_app_task("acme", "s", "other")).await;
    assert_eq!(
        put(&*s, a.id, &[entry("k1", 0.5), entry("k2", 0.125)]).await,
        2
    );
    let found = s
        .cached_embeddings(&app("acme"), &scope("s"), &keys(&["k1", "k2", "k3"]))
        .await
        .expect("cached_embeddings");
    assert_eq!(found.len(), 2, "k3 was never stored");
    assert_eq!(found["k1"], vec![0.5, 0.5, 0.25]);
    assert_eq!(found["k2"], vec![0.125, 0.875, 0.25]);
    for (app_name, scope_name) in [("acme", "t"), ("globex", "s")] {
        let none = s
            .cached_embeddings(&app(app_name), &scope(scope_name), &keys(&["k1", "k2"]))
            .await
            .expect("cached_embeddings");
        assert!(
            none.is_empty(),
            "{app_name}/{scope_name} sees nothing of acme/s"
        );
    }
    assert_eq!(
        put(&*s, other.id, &[entry("k1", 0.75), entry("k4", 0.0)]).await,
        1,
        "k1 has an entry already"
    );
    let found = s
        .cached_embeddings(&app("acme"), &scope("s"), &keys(&["k1", "k4"]))
        .await
        .expect("cached_embeddings");
    assert_eq!(found["k1"], vec![0.5, 0.5, 0.25], "the first entry stays");
    assert_eq!(s.embeddings_of_task(&app("acme"), a.id).await.unwrap(), 2);
    assert_eq!(
        s.embeddings_of_task(&app("acme"), other.id).await.unwrap(),
        1
    );
    assert_eq!(s.embeddings_of_task(&app("globex"), a.id).await.unwrap(), 0);
    // Many keys at once (more than one lookup statement's worth).
    let many: Vec<EmbeddingEntry> = (0..1200).map(|i| entry(&format!("m{i}"), 0.0)).collect();
    assert_eq!(put(&*s, a.id, &many).await, 1200);
    let wanted: Vec<String> = (0..1300).map(|i| format!("m{i}")).collect();
    let found = s
        .cached_embeddings(&app("acme"), &scope("s"), &wanted)
        .await
        .expect("cached_embeddings");
    assert_eq!(found.len(), 1200);
}

/// docs/conformance.md#embed-item-cache: deleting an owner's data deletes the entries
/// its tasks computed, and only those.
pub async fn embedding_cache_entries_go_with_owner_deletion(b: &dyn Backend) {
    let s = b.open().await;
    let acme = app("acme");
    let d1 = create_new(
        &*s,
        new_scoped_task("acme", "s", "d1", "doc-1", unlimited()),
    )
    .await;
    let d2 = create_new(
        &*s,
        new_scoped_task("acme", "s", "d2", "doc-2", unlimited()),
    )
    .await;
    put(&*s, d1.id, &[entry("a", 0.0), entry("b", 0.0)]).await;
    put(&*s, d2.id, &[entry("c", 0.0)]).await;
    s.delete_owner_data(&acme, &scope("s"), Some(&source("doc-1")))
        .await
        .expect("delete_owner_data");
    let found = s
        .cached_embeddings(&acme, &scope("s"), &keys(&["a", "b", "c"]))
        .await
        .expect("cached_embeddings");
    assert_eq!(
        found.keys().collect::<Vec<_>>(),
        vec!["c"],
        "doc-1's entries went with its task, doc-2's stay"
    );
    assert_eq!(
        put(&*s, d1.id, &[entry("a", 0.0)]).await,
        0,
        "nothing is stored for a task that is gone"
    );
    s.delete_owner_data(&acme, &scope("s"), None)
        .await
        .expect("delete_owner_data");
    assert!(
        s.cached_embeddings(&acme, &scope("s"), &keys(&["a", "b", "c"]))
            .await
            .expect("cached_embeddings")
            .is_empty()
    );
}

/// docs/conformance.md#embed-item-cache: retention deletes a task's entries with it.
pub async fn embedding_cache_entries_go_with_retention(b: &dyn Backend) {
    let s = b.open().await;
    let acme = app("acme");
    let config = SweepConfig {
        queue_timeout: hours(24 * 365),
        liveness_timeout: hours(24 * 365),
        retention: hours(1),
        batch_size: 100,
    };
    let gone = create_new(&*s, new_app_task("acme", "s", "gone")).await;
    let kept = create_new(&*s, new_app_task("acme", "s", "kept")).await;
    put(&*s, gone.id, &[entry("g", 0.0)]).await;
    put(&*s, kept.id, &[entry("k", 0.0)]).await;
    succeed(&*s, gone.id).await;
    succeed(&*s, kept.id).await;
    assert!(s.release(&acme, &scope("s"), &key("gone")).await.unwrap());
    b.clock().advance(hours(2));
    assert_eq!(sweep_all(&*s, &config).await.tasks_deleted, 1);
    let found = s
        .cached_embeddings(&acme, &scope("s"), &keys(&["g", "k"]))
        .await
        .expect("cached_embeddings");
    assert_eq!(found.keys().collect::<Vec<_>>(), vec!["k"]);
}

/// docs/conformance.md#embed-item-cache: a task of 1,000 items of which 990 were
/// embedded before finds those 990 in one lookup (the 10 others missing, exactly), and,
/// settled with the 10 others' tokens, is charged for those only: its reservation of
/// every item's input tokens goes, its share of the spend is the 10 items'.
pub async fn a_mostly_cached_embed_task_is_charged_for_its_uncached_items(b: &dyn Backend) {
    let s = b.open().await;
    let w = worker("w");
    let limited = cost_budget(Some(100_000_000), None, None);
    // Three tokens an item (`entry`); input tokens only, no output bound.
    let first = create_new(
        &*s,
        priced_task("acme", "s", "first", "doc-1", limited, reserve(3 * 990, 0)),
    )
    .await;
    claim(&*s, first.id, &w).await;
    let stored: Vec<EmbeddingEntry> = (0..990)
        .map(|i| entry(&format!("item-{i}"), i as f32 / 990.0))
        .collect();
    assert_eq!(put(&*s, first.id, &stored).await, 990);
    s.complete_task(first.id, &lease(&w, 1), spam(), tokens(3 * 990, 0))
        .await
        .expect("complete");
    let before = s.spend(&app("acme"), Some(&scope("s"))).await.unwrap();
    assert_eq!(before.settled_nano, 3 * 990 * 1_000);

    let second = create_new(
        &*s,
        priced_task(
            "acme",
            "s",
            "second",
            "doc-2",
            limited,
            reserve(3 * 1000, 0),
        ),
    )
    .await;
    let reserved = s.spend(&app("acme"), Some(&scope("s"))).await.unwrap();
    assert_eq!(
        reserved.reserved_nano,
        3 * 1000 * 1_000,
        "reserved by every item's input tokens"
    );
    claim(&*s, second.id, &w).await;
    let wanted: Vec<String> = (0..1000).map(|i| format!("item-{i}")).collect();
    let found = s
        .cached_embeddings(&app("acme"), &scope("s"), &wanted)
        .await
        .expect("cached_embeddings");
    assert_eq!(found.len(), 990);
    let mut missing: Vec<&String> = wanted.iter().filter(|k| !found.contains_key(*k)).collect();
    missing.sort();
    let expected: Vec<String> = (990..1000).map(|i| format!("item-{i}")).collect();
    assert_eq!(missing, expected.iter().collect::<Vec<_>>());
    assert_eq!(found["item-495"], stored[495].vector);
    let new: Vec<EmbeddingEntry> = (990..1000)
        .map(|i| entry(&format!("item-{i}"), 0.5))
        .collect();
    assert_eq!(put(&*s, second.id, &new).await, 10);
    s.complete_task(second.id, &lease(&w, 1), spam(), tokens(3 * 10, 0))
        .await
        .expect("complete");
    let after = s.spend(&app("acme"), Some(&scope("s"))).await.unwrap();
    assert_eq!(after.reserved_nano, 0, "the reservation is gone");
    assert_eq!(
        after.settled_nano - before.settled_nano,
        3 * 10 * 1_000,
        "charged for the 10 uncached items only"
    );
    assert_eq!(
        s.embeddings_of_task(&app("acme"), second.id).await.unwrap(),
        10
    );
}

/// docs/conformance.md#embed-item-cache: `embed` tasks reserved by their input tokens
/// fill a scope's limit exactly (the next is refused); one grouped provider call
/// answers them all, each settles its own share (attempt and task), and the settled
/// spend is the call's usage, to the nano-dollar.
pub async fn grouped_embed_tasks_settle_each_its_own_share(b: &dyn Backend) {
    let s = b.open().await;
    let w = worker("w");
    let shares: [u64; 5] = [30, 31, 32, 33, 34];
    let total: u64 = shares.iter().sum();
    let limited = cost_budget(Some(total * 1_000), None, None);
    let mut ids = Vec::new();
    for (t, &n) in shares.iter().enumerate() {
        let task = create_new(
            &*s,
            priced_task(
                "acme",
                "g",
                &format!("g{t}"),
                &format!("doc-{t}"),
                limited,
                reserve(n, 0),
            ),
        )
        .await;
        ids.push(task.id);
    }
    match s
        .create_task(priced_task(
            "acme",
            "g",
            "g5",
            "doc-5",
            limited,
            reserve(1, 0),
        ))
        .await
    {
        Err(tollgate_store::StoreError::Cost(c)) => {
            assert_eq!(c.code(), tollgate_core::ErrorCode::SpendBudget, "{c}")
        }
        other => panic!("the limit is reserved in full: {other:?}"),
    }
    let claimed = s.claim_next(&w, 5).await.expect("claim_next");
    assert_eq!(claimed.len(), 5, "claimed together");
    // The claim opened each task's first attempt (docs/routes.md, "Attempts").
    for t in &claimed {
        assert_eq!(t.attempt, 1, "the claim opens the first attempt");
    }
    // The grouped call used `total` tokens; each task's share is its own texts'.
    for (id, &n) in ids.iter().zip(&shares) {
        let end = AttemptEnd {
            outcome: AttemptOutcome::Succeeded,
            usage: Some(tokens(n, 0)),
            prices: Some(test_prices()),
            error: None,
        };
        assert!(s.end_attempt(*id, 1, &end).await.expect("end_attempt"));
        let t = s
            .complete_task(*id, &lease(&w, 1), spam(), tokens(n, 0))
            .await
            .expect("complete");
        assert!(t.applied);
    }
    let spent = s.spend(&app("acme"), Some(&scope("g"))).await.unwrap();
    assert_eq!((spent.reserved_nano, spent.reserved_tokens), (0, 0));
    assert_eq!(spent.settled_nano, (total * 1_000) as i64);
    assert_eq!(spent.settled_tokens, total as i64);
    for (id, &n) in ids.iter().zip(&shares) {
        let t = get(&*s, &app("acme"), *id).await;
        assert_eq!(t.usage.map(|u| u.input_tokens), Some(n));
        let attempts = s.task_attempts(&app("acme"), *id).await.unwrap();
        assert_eq!(attempts.len(), 1);
        assert_eq!(attempts[0].charged.nano_usd, (n * 1_000) as i64);
    }
}

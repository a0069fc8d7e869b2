//! docs/conformance.md#embed-item-cache: the embeddings item cache — vectors by item key
//! within one app and scope, the first entry of a key kept, each entry owned by the task
//! that computed it and deleted with it (owner deletion, retention), nothing stored for a
//! task that is gone.

use crate::Backend;
use crate::fixtures::*;
use tollgate_store::{EmbeddingEntry, Store, SweepConfig};

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

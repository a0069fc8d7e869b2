//! The embeddings item cache (docs/api.md, "Embeddings") written once for both backends:
//! one vector per (app, scope, item key), owned by the task that computed it and deleted
//! with it (a foreign key on PostgreSQL, a trigger on SQLite), so retention and owner
//! deletion take the entries with their tasks.

use crate::shared::sql::{Backend, Exec, Statement, TxExec};
use crate::{EmbeddingEntry, StoreError, StoreResult};
use std::collections::HashMap;
use tollgate_core::{AppId, ScopeId, TaskId};

/// Keys looked up in one statement (well under both backends' parameter limits).
const LOOKUP_CHUNK: usize = 500;

/// [`EmbeddingStore`](crate::EmbeddingStore)'s methods.
pub(crate) struct Embeddings;

impl Embeddings {
    /// See [`EmbeddingStore::cached_embeddings`](crate::EmbeddingStore::cached_embeddings).
    pub(crate) async fn cached<B: Backend>(
        store: &B,
        app: &AppId,
        scope: &ScopeId,
        keys: &[String],
    ) -> StoreResult<HashMap<String, Vec<f32>>> {
        let mut found = HashMap::new();
        let mut reader = store.reader();
        for chunk in keys.chunks(LOOKUP_CHUNK) {
            let mut s = Statement::new(
                "SELECT item_key, vector FROM embed_cache WHERE app = $1 AND scope = $2 \
                 AND item_key IN (",
            )
            .bind(app.as_str())
            .bind(scope.as_str());
            for (i, key) in chunk.iter().enumerate() {
                if i > 0 {
                    s.push(", ");
                }
                let p = s.placeholder(key.as_str().into());
                s.push(&p);
            }
            s.push(")");
            let rows: Vec<(String, String)> = reader.all(s).await?;
            for (key, text) in rows {
                let vector: Vec<f32> = serde_json::from_str(&text).map_err(|e| {
                    StoreError::Corrupt(format!("embedding cache entry {key}: {e}"))
                })?;
                found.insert(key, vector);
            }
        }
        Ok(found)
    }

    /// See [`EmbeddingStore::put_embeddings`](crate::EmbeddingStore::put_embeddings).
    pub(crate) async fn put<B: Backend>(
        store: &B,
        task: TaskId,
        entries: &[EmbeddingEntry],
    ) -> StoreResult<u64> {
        if entries.is_empty() {
            return Ok(0);
        }
        let mut tx = store.begin_tx().await?;
        let now = store.now_in(&mut tx).await?;
        let id = task.to_string();
        let mut stored = 0;
        for e in entries {
            let vector = serde_json::to_string(&e.vector)
                .map_err(|err| StoreError::Corrupt(format!("embedding vector: {err}")))?;
            // Only while the task exists (its owner may just have been deleted); the
            // first entry of a key stays (an equal key is the same work).
            stored += tx
                .run(
                    Statement::new(
                        "INSERT INTO embed_cache \
                         (app, scope, item_key, task_id, vector, tokens, created_at) \
                         SELECT t.app, t.scope, $1, t.id, $2, $3, $4 FROM tasks t WHERE t.id = $5 \
                         ON CONFLICT (app, scope, item_key) DO NOTHING",
                    )
                    .bind(e.key.as_str())
                    .bind(vector)
                    .bind(i64::try_from(e.tokens).unwrap_or(i64::MAX))
                    .bind(now.0)
                    .bind(&id),
                )
                .await?;
        }
        tx.commit_tx().await?;
        Ok(stored)
    }

    /// See [`EmbeddingStore::embeddings_of_task`](crate::EmbeddingStore::embeddings_of_task).
    pub(crate) async fn of_task<B: Backend>(
        store: &B,
        app: &AppId,
        task: TaskId,
    ) -> StoreResult<u64> {
        let n: i64 = store
            .reader()
            .one::<(i64,)>(
                Statement::new(
                    "SELECT CAST(COUNT(*) AS BIGINT) FROM embed_cache WHERE app = $1 AND task_id = $2",
                )
                .bind(app.as_str())
                .bind(task.to_string()),
            )
            .await?
            .0;
        Ok(u64::try_from(n).unwrap_or(0))
    }
}

/// [`EmbeddingStore`](crate::EmbeddingStore) for a backend (written once here; each
/// backend states it with one line).
macro_rules! embedding_store_for {
    ($store:ty) => {
        #[async_trait::async_trait]
        impl $crate::EmbeddingStore for $store {
            async fn cached_embeddings(
                &self,
                app: &tollgate_core::AppId,
                scope: &tollgate_core::ScopeId,
                keys: &[String],
            ) -> $crate::StoreResult<std::collections::HashMap<String, Vec<f32>>> {
                $crate::shared::embeddings::Embeddings::cached(self, app, scope, keys).await
            }

            async fn put_embeddings(
                &self,
                task: tollgate_core::TaskId,
                entries: &[$crate::EmbeddingEntry],
            ) -> $crate::StoreResult<u64> {
                $crate::shared::embeddings::Embeddings::put(self, task, entries).await
            }

            async fn embeddings_of_task(
                &self,
                app: &tollgate_core::AppId,
                task: tollgate_core::TaskId,
            ) -> $crate::StoreResult<u64> {
                $crate::shared::embeddings::Embeddings::of_task(self, app, task).await
            }
        }
    };
}
pub(crate) use embedding_store_for;

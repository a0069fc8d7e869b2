//! The stream log (docs/api.md, "Streaming a task") written once for both backends: the
//! live output of running tasks as rows of coalesced pieces, so a reader on any replica
//! follows a task another replica executes. Rows go with their task (a foreign key on
//! PostgreSQL, a trigger on SQLite) and are swept a while after it ends
//! ([`sweep_ended`]).

use crate::shared::sql::{Backend, Exec, Statement, TxExec};
use crate::{StoreResult, StreamChunk, StreamPosition};
use tollgate_core::{AppId, TaskId};

/// How long a task's rows stay after it ended: readers that saw part of its stream read
/// the rest before its end (they learn of the end at most a poll interval later).
pub const STREAM_LOG_GRACE: std::time::Duration = std::time::Duration::from_secs(60);

/// [`StreamLogStore`](crate::StreamLogStore)'s methods.
pub(crate) struct StreamLog;

impl StreamLog {
    /// See [`StreamLogStore::append_stream_chunks`](crate::StreamLogStore::append_stream_chunks).
    pub(crate) async fn append<B: Backend>(
        store: &B,
        chunks: &[StreamChunk],
    ) -> StoreResult<Vec<bool>> {
        if chunks.is_empty() {
            return Ok(Vec::new());
        }
        // Task rows in id order (the lock order: each insert's foreign key check holds
        // its task row until the commit, docs/locking.md).
        let mut order: Vec<usize> = (0..chunks.len()).collect();
        order.sort_by_key(|&i| (chunks[i].task.to_string(), chunks[i].position));
        let mut tx = store.begin_tx().await?;
        let now = store.now_in(&mut tx).await?;
        let mut written = vec![false; chunks.len()];
        for i in order {
            let c = &chunks[i];
            // Only while the claim that wrote it still runs the task: a chunk of an
            // execution whose task ended, was requeued or deleted is refused. A chunk
            // written already (a retried call) stays as it was.
            let n = tx
                .run(
                    Statement::new(
                        "INSERT INTO stream_chunks \
                         (task_id, app, claim, seq, events, answered, created_at) \
                         SELECT t.id, t.app, $2, $3, $4, $5, $6 FROM tasks t \
                         WHERE t.id = $1 AND t.status = 'running' AND t.attempt = $2 \
                         ON CONFLICT (task_id, claim, seq) DO NOTHING",
                    )
                    .bind(c.task.to_string())
                    .bind(i64::from(c.position.claim))
                    .bind(i64::from(c.position.seq))
                    .bind(c.events.as_str())
                    .bind(c.answered)
                    .bind(now.0),
                )
                .await?;
            let written_before = n == 0
                && tx
                    .one::<(i64,)>(
                        Statement::new(
                            "SELECT CAST(COUNT(*) AS BIGINT) FROM stream_chunks c \
                             JOIN tasks t ON t.id = c.task_id \
                             WHERE c.task_id = $1 AND c.claim = $2 AND c.seq = $3 \
                             AND t.status = 'running' AND t.attempt = $2",
                        )
                        .bind(c.task.to_string())
                        .bind(i64::from(c.position.claim))
                        .bind(i64::from(c.position.seq)),
                    )
                    .await?
                    .0
                    > 0;
            written[i] = n > 0 || written_before;
        }
        tx.commit_tx().await?;
        Ok(written)
    }

    /// See [`StreamLogStore::stream_chunks`](crate::StreamLogStore::stream_chunks).
    pub(crate) async fn read<B: Backend>(
        store: &B,
        app: &AppId,
        task: TaskId,
        from: StreamPosition,
        limit: u32,
    ) -> StoreResult<Vec<StreamChunk>> {
        let rows: Vec<(i64, i64, String, bool)> = store
            .reader()
            .all(
                Statement::new(
                    "SELECT claim, seq, events, answered FROM stream_chunks \
                     WHERE task_id = $1 AND app = $2 \
                     AND (claim > $3 OR (claim = $3 AND seq >= $4)) \
                     ORDER BY claim, seq LIMIT $5",
                )
                .bind(task.to_string())
                .bind(app.as_str())
                .bind(i64::from(from.claim))
                .bind(i64::from(from.seq))
                .bind(i64::from(limit.max(1))),
            )
            .await?;
        Ok(rows
            .into_iter()
            .map(|(claim, seq, events, answered)| StreamChunk {
                task,
                position: StreamPosition {
                    claim: u32::try_from(claim).unwrap_or(u32::MAX),
                    seq: u32::try_from(seq).unwrap_or(u32::MAX),
                },
                events,
                answered,
            })
            .collect())
    }
}

/// Sweep item: deletes the rows of up to `$2` tasks that ended at or before `$1` (the
/// sweep's cutoff, [`STREAM_LOG_GRACE`] ago); returns how many rows went.
pub(crate) async fn sweep_ended<E: Exec + ?Sized>(
    tx: &mut E,
    cutoff: i64,
    batch: i64,
) -> StoreResult<u64> {
    tx.run(
        Statement::new(
            "DELETE FROM stream_chunks WHERE task_id IN (\
             SELECT t.id FROM tasks t \
             WHERE t.id IN (SELECT c.task_id FROM stream_chunks c) \
             AND t.status IN ('succeeded', 'failed', 'canceled') AND t.completed_at <= $1 \
             LIMIT $2)",
        )
        .bind(cutoff)
        .bind(batch),
    )
    .await
}

/// [`StreamLogStore`](crate::StreamLogStore) for a backend (written once here; each
/// backend states it with one line).
macro_rules! stream_log_store_for {
    ($store:ty) => {
        #[async_trait::async_trait]
        impl $crate::StreamLogStore for $store {
            async fn append_stream_chunks(
                &self,
                chunks: &[$crate::StreamChunk],
            ) -> $crate::StoreResult<Vec<bool>> {
                $crate::shared::stream_log::StreamLog::append(self, chunks).await
            }

            async fn stream_chunks(
                &self,
                app: &tollgate_core::AppId,
                task: tollgate_core::TaskId,
                from: $crate::StreamPosition,
                limit: u32,
            ) -> $crate::StoreResult<Vec<$crate::StreamChunk>> {
                $crate::shared::stream_log::StreamLog::read(self, app, task, from, limit).await
            }
        }
    };
}
pub(crate) use stream_log_store_for;

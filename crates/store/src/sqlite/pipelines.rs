//! Pipelines on SQLite ([`PipelineStore`](crate::PipelineStore), written once in
//! `shared::pipelines`): the claim is one plain update, and a keyed start is one
//! `BEGIN IMMEDIATE` transaction.

use super::SqliteStore;
use crate::shared::pipelines::{
    PipelineStatements, insert_pipeline_run, keyed_run, pipeline_store_for,
};
use crate::{PipelineRef, StoreError, StoreResult};
use async_trait::async_trait;
use tollgate_core::{EffectKey, NewRun, Run};

#[async_trait]
impl PipelineStatements for SqliteStore {
    const CLAIM_PIPELINE_RUNS: &'static str = "UPDATE pipeline_runs SET driver = ?1, \
         lease_until = ?2 WHERE run_id IN (\
         SELECT p.run_id FROM pipeline_runs p JOIN runs r ON r.id = p.run_id \
         WHERE p.done = 0 AND p.wake_at <= ?3 AND (p.lease_until IS NULL OR p.lease_until < ?3) \
         AND r.state = 'running' ORDER BY p.wake_at LIMIT ?4) RETURNING run_id";

    /// Writers are serialized, so looking the key up and inserting cannot race.
    async fn start_run(
        &self,
        new: NewRun,
        pipeline: &PipelineRef,
        start_key: Option<&EffectKey>,
    ) -> StoreResult<(Run, bool)> {
        let mut tx = self.begin().await?;
        let now = self.now();
        if let Some(key) = start_key
            && let Some(run) = keyed_run(&mut tx, &new.app, key).await?
        {
            tx.commit().await?;
            return Ok((run, false));
        }
        let run = insert_pipeline_run(&mut tx, now, &new, pipeline, start_key)
            .await?
            .ok_or_else(|| StoreError::Database("inserted run vanished".into()))?;
        tx.commit().await?;
        Ok((run, true))
    }
}

pipeline_store_for!(SqliteStore);

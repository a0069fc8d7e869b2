//! Pipelines on PostgreSQL ([`PipelineStore`](crate::PipelineStore), written once in
//! `shared::pipelines`): the claim skips rows other replicas hold, so two replicas never
//! drive one run at once; a keyed start looks its key up, inserts under it, and looks
//! again if another transaction took it meanwhile.

use super::PostgresStore;
use crate::shared::pipelines::{
    PipelineStatements, insert_pipeline_run, keyed_run, pipeline_store_for,
};
use crate::{PipelineRef, StoreError, StoreResult};
use async_trait::async_trait;
use tollgate_core::{AppId, EffectKey, NewRun, Run};

/// The run holding `start_key`, read in a transaction of its own.
async fn keyed(
    store: &PostgresStore,
    app: &AppId,
    start_key: &EffectKey,
) -> StoreResult<Option<Run>> {
    let mut tx = store.begin().await?;
    let run = keyed_run(&mut tx, app, start_key).await?;
    tx.commit().await?;
    Ok(run)
}

#[async_trait]
impl PipelineStatements for PostgresStore {
    const CLAIM_PIPELINE_RUNS: &'static str = "WITH picked AS MATERIALIZED (SELECT p.run_id \
         FROM pipeline_runs p JOIN runs r ON r.id = p.run_id \
         WHERE NOT p.done AND p.wake_at <= $3 AND (p.lease_until IS NULL OR p.lease_until < $3) \
         AND r.state = 'running' ORDER BY p.wake_at LIMIT $4 FOR UPDATE OF p SKIP LOCKED) \
         UPDATE pipeline_runs SET driver = $1, lease_until = $2 FROM picked \
         WHERE pipeline_runs.run_id = picked.run_id RETURNING pipeline_runs.run_id";

    /// Inserts under the key; when another transaction holds or committed the key (the
    /// unique index makes a concurrent insert wait, then do nothing), this one rolls back
    /// and answers the run that has it.
    async fn start_run(
        &self,
        new: NewRun,
        pipeline: &PipelineRef,
        start_key: Option<&EffectKey>,
    ) -> StoreResult<(Run, bool)> {
        if let Some(key) = start_key
            && let Some(run) = keyed(self, &new.app, key).await?
        {
            return Ok((run, false));
        }
        let mut tx = self.begin().await?;
        let now = self.now(&mut tx).await?;
        if let Some(run) = insert_pipeline_run(&mut tx, now, &new, pipeline, start_key).await? {
            tx.commit().await?;
            return Ok((run, true));
        }
        // Dropping the transaction rolls the run row back.
        drop(tx);
        let Some(key) = start_key else {
            return Err(StoreError::Database("inserted run vanished".into()));
        };
        keyed(self, &new.app, key)
            .await?
            .map(|run| (run, false))
            .ok_or_else(|| {
                StoreError::Database(format!(
                    "pipeline run key {key} was taken, yet no run has it"
                ))
            })
    }
}

pipeline_store_for!(PostgresStore);

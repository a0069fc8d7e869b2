//! Pipelines on SQLite: definitions, pipeline runs and their driver leases.

use super::SqliteStore;
use super::runs::{fetch_run, insert_run};
use crate::shared::rows::{PipelineRefRow, PipelineRow, RunRow, pipeline_run_id, run_columns};
use crate::{MAX_PAGE, PipelineRef, PipelineStore, StoreError, StoreResult, StoredPipeline};
use async_trait::async_trait;
use std::time::Duration;
use tollgate_core::canonical::canonical_json;
use tollgate_core::{AppId, EffectKey, NewRun, PipelineName, Run, RunId, Timestamp, WorkerId};

/// One `BEGIN IMMEDIATE` transaction: writers are serialized, so looking the key up and
/// inserting cannot race.
async fn insert_pipeline_run(
    store: &SqliteStore,
    new: NewRun,
    pipeline: &PipelineRef,
    start_key: Option<&EffectKey>,
) -> StoreResult<(Run, bool)> {
    let mut tx = store.begin().await?;
    let now = store.now();
    if let Some(key) = start_key {
        let existing: Option<String> =
            sqlx::query_scalar("SELECT run_id FROM pipeline_runs WHERE app = ? AND start_key = ?")
                .bind(new.app.as_str())
                .bind(key.as_str())
                .fetch_optional(&mut *tx)
                .await?;
        if let Some(id) = existing {
            let id = pipeline_run_id(&id)?;
            let run = fetch_run(&mut *tx, &new.app, id).await?;
            tx.commit().await?;
            let run = run
                .ok_or_else(|| StoreError::Corrupt(format!("pipeline run {id} has no run row")))?;
            return Ok((run, false));
        }
    }
    let exists: Option<i64> =
        sqlx::query_scalar("SELECT 1 FROM pipelines WHERE app = ? AND name = ? AND version = ?")
            .bind(new.app.as_str())
            .bind(pipeline.name.as_str())
            .bind(&pipeline.version)
            .fetch_optional(&mut *tx)
            .await?;
    if exists.is_none() {
        return Err(StoreError::InvalidState(format!(
            "pipeline {} version {} is not registered",
            pipeline.name, pipeline.version
        )));
    }
    let id = insert_run(&mut tx, &new, now).await?;
    sqlx::query(
        "INSERT INTO pipeline_runs (run_id, app, pipeline, version, wake_at, start_key) \
         VALUES (?, ?, ?, ?, ?, ?)",
    )
    .bind(id.to_string())
    .bind(new.app.as_str())
    .bind(pipeline.name.as_str())
    .bind(&pipeline.version)
    .bind(now.0)
    .bind(start_key.map(EffectKey::as_str))
    .execute(&mut *tx)
    .await?;
    let run = fetch_run(&mut *tx, &new.app, id).await?;
    tx.commit().await?;
    let run = run.ok_or_else(|| StoreError::Database("inserted run vanished".into()))?;
    Ok((run, true))
}

#[async_trait]
impl PipelineStore for SqliteStore {
    async fn put_pipeline(
        &self,
        app: &AppId,
        name: &PipelineName,
        version: &str,
        definition: &serde_json::Value,
    ) -> StoreResult<(StoredPipeline, bool)> {
        let text = canonical_json(definition).map_err(|e| e.within("definition"))?;
        let mut tx = self.begin().await?;
        let now = self.now();
        let created = sqlx::query(
            "INSERT INTO pipelines (app, name, version, definition, created_at) VALUES (?, ?, ?, ?, ?) \
             ON CONFLICT (app, name, version) DO NOTHING",
        )
        .bind(app.as_str())
        .bind(name.as_str())
        .bind(version)
        .bind(&text)
        .bind(now.0)
        .execute(&mut *tx)
        .await?
        .rows_affected()
            == 1;
        let row: PipelineRow = sqlx::query_as(
            "SELECT version, definition, created_at FROM pipelines \
             WHERE app = ? AND name = ? AND version = ?",
        )
        .bind(app.as_str())
        .bind(name.as_str())
        .bind(version)
        .fetch_one(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok((row.into_stored(app, name)?, created))
    }

    async fn get_pipeline(
        &self,
        app: &AppId,
        name: &PipelineName,
        version: Option<&str>,
    ) -> StoreResult<Option<StoredPipeline>> {
        let row: Option<PipelineRow> = sqlx::query_as(
            "SELECT version, definition, created_at FROM pipelines \
             WHERE app = ?1 AND name = ?2 AND (?3 IS NULL OR version = ?3) \
             ORDER BY created_at DESC, version DESC LIMIT 1",
        )
        .bind(app.as_str())
        .bind(name.as_str())
        .bind(version)
        .fetch_optional(&self.reader)
        .await?;
        row.map(|r| r.into_stored(app, name)).transpose()
    }

    async fn create_pipeline_run(&self, new: NewRun, pipeline: &PipelineRef) -> StoreResult<Run> {
        insert_pipeline_run(self, new, pipeline, None)
            .await
            .map(|(run, _)| run)
    }

    async fn start_pipeline_run_once(
        &self,
        new: NewRun,
        pipeline: &PipelineRef,
        start_key: &EffectKey,
    ) -> StoreResult<(Run, bool)> {
        insert_pipeline_run(self, new, pipeline, Some(start_key)).await
    }

    async fn run_pipeline(&self, app: &AppId, run: RunId) -> StoreResult<Option<PipelineRef>> {
        let row: Option<PipelineRefRow> = sqlx::query_as(
            "SELECT pipeline, version FROM pipeline_runs WHERE run_id = ? AND app = ?",
        )
        .bind(run.to_string())
        .bind(app.as_str())
        .fetch_optional(&self.reader)
        .await?;
        row.map(PipelineRefRow::into_ref).transpose()
    }

    async fn claim_pipeline_runs(
        &self,
        driver: &WorkerId,
        lease: Duration,
        limit: u32,
    ) -> StoreResult<Vec<Run>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let mut tx = self.begin().await?;
        let now = self.now();
        let ids: Vec<String> = sqlx::query_scalar(
            "UPDATE pipeline_runs SET driver = ?1, lease_until = ?2 WHERE run_id IN (\
             SELECT p.run_id FROM pipeline_runs p JOIN runs r ON r.id = p.run_id \
             WHERE p.done = 0 AND p.wake_at <= ?3 AND (p.lease_until IS NULL OR p.lease_until < ?3) \
             AND r.state = 'running' ORDER BY p.wake_at LIMIT ?4) RETURNING run_id",
        )
        .bind(driver.as_str())
        .bind(now.plus(lease).0)
        .bind(now.0)
        .bind(i64::from(limit.min(MAX_PAGE)))
        .fetch_all(&mut *tx)
        .await?;
        let mut runs = Vec::with_capacity(ids.len());
        for id in &ids {
            let row: Option<RunRow> = sqlx::query_as(concat!(
                "SELECT ",
                run_columns!(),
                " FROM runs WHERE id = ?"
            ))
            .bind(id)
            .fetch_optional(&mut *tx)
            .await?;
            if let Some(r) = row {
                runs.push(r.into_run()?);
            }
        }
        tx.commit().await?;
        Ok(runs)
    }

    async fn release_pipeline_run(
        &self,
        run: RunId,
        driver: &WorkerId,
        wake_at: Option<Timestamp>,
    ) -> StoreResult<bool> {
        let mut tx = self.begin().await?;
        let now = self.now();
        let released = sqlx::query(
            "UPDATE pipeline_runs SET driver = NULL, lease_until = NULL, wake_at = ? \
             WHERE run_id = ? AND driver = ?",
        )
        .bind(wake_at.unwrap_or(now).0)
        .bind(run.to_string())
        .bind(driver.as_str())
        .execute(&mut *tx)
        .await?
        .rows_affected()
            == 1;
        tx.commit().await?;
        Ok(released)
    }
}

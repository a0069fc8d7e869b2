//! Pipelines written once ([`Pipelines`]): definitions, pipeline runs and their driver
//! leases. A backend supplies its claim (PostgreSQL skips rows other replicas hold, so
//! two replicas never drive one run at once) and how a keyed start is guarded
//! ([`PipelineStatements`]); the steps of a start are here.

use crate::shared::rows::{PipelineRefRow, PipelineRow, RunRow, pipeline_run_id, run_columns};
use crate::shared::runs::{fetch_run, insert_run};
use crate::shared::sql::{Backend, Exec, Statement, TxExec};
use crate::{MAX_PAGE, PipelineRef, StoreError, StoreResult, StoredPipeline};
use async_trait::async_trait;
use std::time::Duration;
use tollgate_core::canonical::canonical_json;
use tollgate_core::{AppId, EffectKey, NewRun, PipelineName, Run, RunId, Timestamp, WorkerId};

/// What differs between the backends for pipelines.
#[async_trait]
pub(crate) trait PipelineStatements: Backend {
    /// Leases up to `$4` due pipeline runs to driver `$1` until `$2` (now `$3`), returning
    /// their run ids.
    const CLAIM_PIPELINE_RUNS: &'static str;

    /// Starts a pipeline run, once per `start_key` when one is given: the run and whether
    /// this call created it. Built from [`keyed_run`] and [`insert_pipeline_run`], in the
    /// backend's transactions.
    async fn start_run(
        &self,
        new: NewRun,
        pipeline: &PipelineRef,
        start_key: Option<&EffectKey>,
    ) -> StoreResult<(Run, bool)>;
}

/// The run that holds `start_key`, if any.
pub(crate) async fn keyed_run<E: Exec + ?Sized>(
    tx: &mut E,
    app: &AppId,
    start_key: &EffectKey,
) -> StoreResult<Option<Run>> {
    let existing: Option<(String,)> = tx
        .optional(
            Statement::new("SELECT run_id FROM pipeline_runs WHERE app = $1 AND start_key = $2")
                .bind(app.as_str())
                .bind(start_key.as_str()),
        )
        .await?;
    let Some((id,)) = existing else {
        return Ok(None);
    };
    let id = pipeline_run_id(&id)?;
    let run = fetch_run(tx, app, id).await?;
    run.map(Some)
        .ok_or_else(|| StoreError::Corrupt(format!("pipeline run {id} has no run row")))
}

/// The run and its pipeline row, in the caller's transaction. `None`: another
/// transaction holds or committed the key (the unique index makes a concurrent insert
/// wait, then do nothing); the caller drops its transaction, rolling the run row back.
pub(crate) async fn insert_pipeline_run<E: Exec + ?Sized>(
    tx: &mut E,
    now: Timestamp,
    new: &NewRun,
    pipeline: &PipelineRef,
    start_key: Option<&EffectKey>,
) -> StoreResult<Option<Run>> {
    let exists: Option<(i32,)> = tx
        .optional(
            Statement::new("SELECT 1 FROM pipelines WHERE app = $1 AND name = $2 AND version = $3")
                .bind(new.app.as_str())
                .bind(pipeline.name.as_str())
                .bind(&pipeline.version),
        )
        .await?;
    if exists.is_none() {
        return Err(StoreError::InvalidState(format!(
            "pipeline {} version {} is not registered",
            pipeline.name, pipeline.version
        )));
    }
    let id = insert_run(tx, new, now).await?;
    let inserted = tx
        .run(
            Statement::new(
                "INSERT INTO pipeline_runs (run_id, app, pipeline, version, wake_at, start_key) \
                 VALUES ($1, $2, $3, $4, $5, $6) \
                 ON CONFLICT (app, start_key) WHERE start_key IS NOT NULL DO NOTHING",
            )
            .bind(id.to_string())
            .bind(new.app.as_str())
            .bind(pipeline.name.as_str())
            .bind(&pipeline.version)
            .bind(now.0)
            .bind(start_key.map(EffectKey::as_str)),
        )
        .await?;
    if inserted == 0 {
        return Ok(None);
    }
    let run = fetch_run(tx, &new.app, id).await?;
    run.map(Some)
        .ok_or_else(|| StoreError::Database("inserted run vanished".into()))
}

/// [`PipelineStore`](crate::PipelineStore)'s methods.
pub(crate) struct Pipelines;

impl Pipelines {
    pub(crate) async fn put_pipeline<B: PipelineStatements>(
        store: &B,
        app: &AppId,
        name: &PipelineName,
        version: &str,
        definition: &serde_json::Value,
    ) -> StoreResult<(StoredPipeline, bool)> {
        let text = canonical_json(definition).map_err(|e| e.within("definition"))?;
        let mut tx = store.begin_tx().await?;
        let now = store.now_in(&mut tx).await?;
        let created = tx
            .run(
                Statement::new(
                    "INSERT INTO pipelines (app, name, version, definition, created_at) \
                     VALUES ($1, $2, $3, $4, $5) ON CONFLICT (app, name, version) DO NOTHING",
                )
                .bind(app.as_str())
                .bind(name.as_str())
                .bind(version)
                .bind(text)
                .bind(now.0),
            )
            .await?
            == 1;
        let row: PipelineRow = tx
            .one(
                Statement::new(
                    "SELECT version, definition, created_at FROM pipelines \
                     WHERE app = $1 AND name = $2 AND version = $3",
                )
                .bind(app.as_str())
                .bind(name.as_str())
                .bind(version),
            )
            .await?;
        tx.commit_tx().await?;
        Ok((row.into_stored(app, name)?, created))
    }

    /// The named version, or the newest.
    pub(crate) async fn get_pipeline<B: PipelineStatements>(
        store: &B,
        app: &AppId,
        name: &PipelineName,
        version: Option<&str>,
    ) -> StoreResult<Option<StoredPipeline>> {
        let select = match version {
            Some(version) => Statement::new(
                "SELECT version, definition, created_at FROM pipelines \
                 WHERE app = $1 AND name = $2 AND version = $3",
            )
            .bind(app.as_str())
            .bind(name.as_str())
            .bind(version),
            None => Statement::new(
                "SELECT version, definition, created_at FROM pipelines \
                 WHERE app = $1 AND name = $2 ORDER BY created_at DESC, version DESC LIMIT 1",
            )
            .bind(app.as_str())
            .bind(name.as_str()),
        };
        let row: Option<PipelineRow> = store.reader().optional(select).await?;
        row.map(|r| r.into_stored(app, name)).transpose()
    }

    pub(crate) async fn run_pipeline<B: PipelineStatements>(
        store: &B,
        app: &AppId,
        run: RunId,
    ) -> StoreResult<Option<PipelineRef>> {
        let row: Option<PipelineRefRow> = store
            .reader()
            .optional(
                Statement::new(
                    "SELECT pipeline, version FROM pipeline_runs WHERE run_id = $1 AND app = $2",
                )
                .bind(run.to_string())
                .bind(app.as_str()),
            )
            .await?;
        row.map(PipelineRefRow::into_ref).transpose()
    }

    pub(crate) async fn claim_pipeline_runs<B: PipelineStatements>(
        store: &B,
        driver: &WorkerId,
        lease: Duration,
        limit: u32,
    ) -> StoreResult<Vec<Run>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let mut tx = store.begin_tx().await?;
        let now = store.now_in(&mut tx).await?;
        let ids: Vec<(String,)> = tx
            .all(
                Statement::new(B::CLAIM_PIPELINE_RUNS)
                    .bind(driver.as_str())
                    .bind(now.plus(lease).0)
                    .bind(now.0)
                    .bind(i64::from(limit.min(MAX_PAGE))),
            )
            .await?;
        let mut runs = Vec::with_capacity(ids.len());
        for (id,) in ids {
            let row: Option<RunRow> = tx
                .optional(
                    Statement::new(concat!(
                        "SELECT ",
                        run_columns!(),
                        " FROM runs WHERE id = $1"
                    ))
                    .bind(id),
                )
                .await?;
            if let Some(r) = row {
                runs.push(r.into_run()?);
            }
        }
        tx.commit_tx().await?;
        Ok(runs)
    }

    pub(crate) async fn release_pipeline_run<B: PipelineStatements>(
        store: &B,
        run: RunId,
        driver: &WorkerId,
        wake_at: Option<Timestamp>,
    ) -> StoreResult<bool> {
        let mut tx = store.begin_tx().await?;
        let now = store.now_in(&mut tx).await?;
        let released = tx
            .run(
                Statement::new(
                    "UPDATE pipeline_runs SET driver = NULL, lease_until = NULL, wake_at = $1 \
                     WHERE run_id = $2 AND driver = $3",
                )
                .bind(wake_at.unwrap_or(now).0)
                .bind(run.to_string())
                .bind(driver.as_str()),
            )
            .await?
            == 1;
        tx.commit_tx().await?;
        Ok(released)
    }
}

/// [`PipelineStore`](crate::PipelineStore) for a backend that implements
/// [`PipelineStatements`] (written once; the store's wrappers forward the trait by a
/// blanket impl, so each backend states its own).
macro_rules! pipeline_store_for {
    ($store:ty) => {
        #[async_trait::async_trait]
        impl $crate::PipelineStore for $store {
            async fn put_pipeline(
                &self,
                app: &tollgate_core::AppId,
                name: &tollgate_core::PipelineName,
                version: &str,
                definition: &serde_json::Value,
            ) -> $crate::StoreResult<($crate::StoredPipeline, bool)> {
                $crate::shared::pipelines::Pipelines::put_pipeline(
                    self, app, name, version, definition,
                )
                .await
            }

            async fn get_pipeline(
                &self,
                app: &tollgate_core::AppId,
                name: &tollgate_core::PipelineName,
                version: Option<&str>,
            ) -> $crate::StoreResult<Option<$crate::StoredPipeline>> {
                $crate::shared::pipelines::Pipelines::get_pipeline(self, app, name, version).await
            }

            async fn create_pipeline_run(
                &self,
                new: tollgate_core::NewRun,
                pipeline: &$crate::PipelineRef,
            ) -> $crate::StoreResult<tollgate_core::Run> {
                $crate::shared::pipelines::PipelineStatements::start_run(self, new, pipeline, None)
                    .await
                    .map(|(run, _)| run)
            }

            async fn start_pipeline_run_once(
                &self,
                new: tollgate_core::NewRun,
                pipeline: &$crate::PipelineRef,
                start_key: &tollgate_core::EffectKey,
            ) -> $crate::StoreResult<(tollgate_core::Run, bool)> {
                $crate::shared::pipelines::PipelineStatements::start_run(
                    self,
                    new,
                    pipeline,
                    Some(start_key),
                )
                .await
            }

            async fn run_pipeline(
                &self,
                app: &tollgate_core::AppId,
                run: tollgate_core::RunId,
            ) -> $crate::StoreResult<Option<$crate::PipelineRef>> {
                $crate::shared::pipelines::Pipelines::run_pipeline(self, app, run).await
            }

            async fn claim_pipeline_runs(
                &self,
                driver: &tollgate_core::WorkerId,
                lease: std::time::Duration,
                limit: u32,
            ) -> $crate::StoreResult<Vec<tollgate_core::Run>> {
                $crate::shared::pipelines::Pipelines::claim_pipeline_runs(
                    self, driver, lease, limit,
                )
                .await
            }

            async fn release_pipeline_run(
                &self,
                run: tollgate_core::RunId,
                driver: &tollgate_core::WorkerId,
                wake_at: Option<tollgate_core::Timestamp>,
            ) -> $crate::StoreResult<bool> {
                $crate::shared::pipelines::Pipelines::release_pipeline_run(
                    self, run, driver, wake_at,
                )
                .await
            }
        }
    };
}
pub(crate) use pipeline_store_for;

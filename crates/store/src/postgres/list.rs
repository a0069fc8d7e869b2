//! SPEC §15 listings on PostgreSQL: the shared statements of [`crate::list`], bound and
//! read outside any transaction (they decide nothing, so they take no lock).

use super::PostgresStore;
use crate::list::{
    Arg, Dialect, ListCursor, ListPage, ListSql, ListStore, ListedRun, PipelineSummary,
    RunListQuery, ScopeSnapshot, TaskListQuery, TaskStatsRaw,
};
use crate::shared::rows::{RunRow, TaskRow};
use crate::{PipelineRef, StoreError, StoreResult};
use async_trait::async_trait;
use sqlx::postgres::{PgArguments, PgRow};
use sqlx::{Arguments, FromRow, Postgres};
use tollgate_core::admission::ADMISSION_WINDOW;
use tollgate_core::{AppId, PipelineName, ScopeId, Task, Timestamp};

const D: Dialect = Dialect::Postgres;

fn args(sql: &ListSql) -> StoreResult<PgArguments> {
    let mut a = PgArguments::default();
    for arg in &sql.args {
        match arg {
            Arg::Text(s) => a.add(s.clone()),
            Arg::Int(i) => a.add(*i),
        }
        .map_err(|e| StoreError::Database(e.to_string()))?;
    }
    Ok(a)
}

impl PostgresStore {
    /// "Now": the configured clock, or the database's.
    async fn read_now(&self) -> StoreResult<Timestamp> {
        match self.fixed_now() {
            Some(ms) => Ok(Timestamp(ms)),
            None => Ok(Timestamp(
                sqlx::query_scalar("SELECT (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT")
                    .fetch_one(&self.pool)
                    .await?,
            )),
        }
    }

    async fn rows_of<T>(&self, sql: ListSql) -> StoreResult<Vec<T>>
    where
        T: for<'r> FromRow<'r, PgRow> + Send + Unpin,
    {
        let a = args(&sql)?;
        Ok(
            sqlx::query_as_with::<Postgres, T, _>(sqlx::AssertSqlSafe(sql.text), a)
                .fetch_all(&self.pool)
                .await?,
        )
    }
}

#[async_trait]
impl ListStore for PostgresStore {
    async fn list_tasks(&self, app: &AppId, query: &TaskListQuery) -> StoreResult<ListPage<Task>> {
        let rows: Vec<TaskRow> = self.rows_of(crate::list::tasks_sql(D, app, query)).await?;
        let tasks = crate::shared::rows::tasks(rows)?;
        Ok(crate::list::page_of(tasks, query.limit, |t| {
            ListCursor::Newest {
                listing: 't',
                at: t.created_at,
                id: t.id.to_string(),
            }
        }))
    }

    async fn list_runs(
        &self,
        app: &AppId,
        query: &RunListQuery,
    ) -> StoreResult<ListPage<ListedRun>> {
        let rows: Vec<RunRow> = self.rows_of(crate::list::runs_sql(D, app, query)).await?;
        let runs = rows
            .into_iter()
            .map(RunRow::into_run)
            .collect::<Result<Vec<_>, _>>()?;
        let page = crate::list::page_of(runs, query.limit, |r| ListCursor::Newest {
            listing: 'r',
            at: r.created_at,
            id: r.id.to_string(),
        });
        let pipelines: Vec<(String, String, String)> = if page.items.is_empty() {
            Vec::new()
        } else {
            self.rows_of(crate::list::run_pipelines_sql(D, &page.items))
                .await?
        };
        Ok(ListPage {
            next: page.next,
            items: page
                .items
                .into_iter()
                .map(|run| {
                    let id = run.id.to_string();
                    let pipeline = pipelines.iter().find(|p| p.0 == id).and_then(|p| {
                        Some(PipelineRef {
                            name: PipelineName::new(p.1.clone()).ok()?,
                            version: p.2.clone(),
                        })
                    });
                    ListedRun { run, pipeline }
                })
                .collect(),
        })
    }

    async fn list_pipelines(
        &self,
        app: &AppId,
        after: Option<&ListCursor>,
        limit: u32,
    ) -> StoreResult<ListPage<PipelineSummary>> {
        let names: Vec<(String,)> = self
            .rows_of(crate::list::pipeline_names_sql(D, app, after, limit))
            .await?;
        let page = crate::list::page_of(names, limit, |n| ListCursor::Name {
            listing: 'p',
            name: n.0.clone(),
        });
        let (Some(first), Some(last)) = (page.items.first(), page.items.last()) else {
            return Ok(ListPage {
                items: Vec::new(),
                next: None,
            });
        };
        let versions: Vec<(String, String, i64)> = self
            .rows_of(crate::list::pipeline_versions_sql(
                D, app, &first.0, &last.0,
            ))
            .await?;
        Ok(ListPage {
            items: crate::list::pipelines_of(&page.items, &versions),
            next: page.next,
        })
    }

    async fn list_scopes(
        &self,
        app: &AppId,
        after: Option<&ListCursor>,
        limit: u32,
    ) -> StoreResult<ListPage<ScopeSnapshot>> {
        let cutoff = self.read_now().await?.minus(ADMISSION_WINDOW);
        let names: Vec<(String,)> = self
            .rows_of(crate::list::scopes_sql(D, app, cutoff, after, limit))
            .await?;
        let page = crate::list::page_of(names, limit, |n| ListCursor::Name {
            listing: 's',
            name: n.0.clone(),
        });
        let mut items = Vec::with_capacity(page.items.len());
        for (name,) in page.items {
            let scope = ScopeId::new(name).map_err(|e| StoreError::Corrupt(e.to_string()))?;
            items.push(self.scope_snapshot(app, &scope).await?);
        }
        Ok(ListPage {
            items,
            next: page.next,
        })
    }

    async fn scope_snapshot(&self, app: &AppId, scope: &ScopeId) -> StoreResult<ScopeSnapshot> {
        let now = self.read_now().await?;
        let cutoff = now.minus(ADMISSION_WINDOW);
        let [state, sources, per_source] = crate::list::scope_sqls(D, app, scope, cutoff);
        let state: Vec<(i64, i64, i64)> = self.rows_of(state).await?;
        let sources: Vec<(i64,)> = self.rows_of(sources).await?;
        let per_source: Vec<(String, i64, i64, Option<i64>)> = self.rows_of(per_source).await?;
        let steps: Vec<(i64,)> = self
            .rows_of(crate::list::scope_steps_sql(D, app, scope, cutoff))
            .await?;
        Ok(crate::list::snapshot_of(
            scope,
            now,
            state.first().copied(),
            sources.first().map_or(0, |s| s.0),
            &per_source,
            steps.first().map_or(0, |s| s.0),
        ))
    }

    async fn task_stats(&self, app: &AppId, since: Option<Timestamp>) -> StoreResult<TaskStatsRaw> {
        let now = self.read_now().await?;
        let since = since.unwrap_or_else(|| now.minus(std::time::Duration::from_secs(3600)));
        let counts: Vec<(String, i64)> =
            self.rows_of(crate::list::active_counts_sql(D, app)).await?;
        let rows: Vec<(String, Option<String>, bool, Option<i64>)> = self
            .rows_of(crate::list::finished_sql(D, app, since))
            .await?;
        Ok(crate::list::stats_of(now, &counts, rows))
    }
}

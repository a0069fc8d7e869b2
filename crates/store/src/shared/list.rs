//! docs/conformance.md#listings listings, written once for both backends: a backend supplies its clock and
//! its read pool ([`Backend`]); every listing's logic (pages, cursors, joins of runs to
//! pipelines, snapshots, stats) lives here. Listings decide nothing, so they read outside
//! any transaction and take no lock.

use crate::list::{
    ListCursor, ListPage, ListStore, ListedRun, PipelineSummary, RunListQuery, ScopeSnapshot,
    TaskListQuery, TaskStatsRaw,
};
use crate::shared::rows::{RunRow, TaskRow};
use crate::shared::sql::{Backend, Exec, Fetched, Statement};
use crate::{PipelineRef, StoreError, StoreResult};
use async_trait::async_trait;
use tollgate_core::admission::ADMISSION_WINDOW;
use tollgate_core::{AppId, PipelineName, ScopeId, Task, Timestamp};

/// The rows of one listing statement, read on the backend's read pool.
async fn rows_of<S: Backend, T: Fetched>(store: &S, sql: Statement) -> StoreResult<Vec<T>> {
    store.reader().all(sql).await
}

#[async_trait]
impl<S: Backend> ListStore for S {
    async fn list_tasks(&self, app: &AppId, query: &TaskListQuery) -> StoreResult<ListPage<Task>> {
        let rows: Vec<TaskRow> = rows_of(self, crate::list::tasks_sql(app, query)).await?;
        let tasks = crate::shared::rows::tasks(rows)?;
        let mut page = crate::list::page_of(tasks, query.limit, |t| ListCursor::Newest {
            listing: 't',
            at: t.created_at,
            id: t.id.to_string(),
        });
        // A walked filter read at most LIST_WALK tasks: a page that ended short of its
        // limit goes on from where the walk stopped, if it stopped before the end.
        if page.next.is_none() && crate::list::tasks_walked(query) {
            let floor: Vec<(i64, String)> =
                rows_of(self, crate::list::task_walk_floor_sql(app, query)).await?;
            page.next = floor.into_iter().next().map(|(at, id)| ListCursor::Newest {
                listing: 't',
                at: Timestamp(at),
                id,
            });
        }
        Ok(page)
    }

    async fn list_runs(
        &self,
        app: &AppId,
        query: &RunListQuery,
    ) -> StoreResult<ListPage<ListedRun>> {
        let rows: Vec<RunRow> = rows_of(self, crate::list::runs_sql(app, query)).await?;
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
            rows_of(self, crate::list::run_pipelines_sql(&page.items)).await?
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
        let names: Vec<(String,)> =
            rows_of(self, crate::list::pipeline_names_sql(app, after, limit)).await?;
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
        let versions: Vec<(String, String, i64)> = rows_of(
            self,
            crate::list::pipeline_versions_sql(app, &first.0, &last.0),
        )
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
        let cutoff = self.now_out().await?.minus(ADMISSION_WINDOW);
        let names: Vec<(String,)> =
            rows_of(self, crate::list::scopes_sql(app, cutoff, after, limit)).await?;
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
        let now = self.now_out().await?;
        let cutoff = now.minus(ADMISSION_WINDOW);
        let [state, sources, per_source] = crate::list::scope_sqls(app, scope, cutoff);
        let state: Vec<(i64, i64, i64)> = rows_of(self, state).await?;
        let sources: Vec<(i64,)> = rows_of(self, sources).await?;
        let per_source: Vec<(String, i64, i64, Option<i64>)> = rows_of(self, per_source).await?;
        let steps: Vec<(i64,)> =
            rows_of(self, crate::list::scope_steps_sql(app, scope, cutoff)).await?;
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
        let now = self.now_out().await?;
        let since = since.unwrap_or_else(|| now.minus(std::time::Duration::from_secs(3600)));
        let counts: Vec<(String, i64)> = rows_of(self, crate::list::active_counts_sql(app)).await?;
        let rows: Vec<crate::list::FinishedRow> =
            rows_of(self, crate::list::finished_sql(app, since)).await?;
        Ok(crate::list::stats_of(now, &counts, rows))
    }
}

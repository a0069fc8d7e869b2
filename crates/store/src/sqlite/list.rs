//! SPEC §15 listings on SQLite: the shared statements of [`crate::list`], bound and read
//! on the read pool (they decide nothing, so they never take the write lock).

use super::SqliteStore;
use crate::list::{
    Arg, Dialect, ListCursor, ListPage, ListSql, ListStore, ListedRun, PipelineSummary,
    RunListQuery, ScopeSnapshot, TaskListQuery, TaskStatsRaw,
};
use crate::shared::rows::{RunRow, TaskRow};
use crate::{PipelineRef, StoreError, StoreResult};
use async_trait::async_trait;
use sqlx::sqlite::{SqliteArguments, SqliteRow};
use sqlx::{Arguments, FromRow, Sqlite};
use tollgate_core::admission::ADMISSION_WINDOW;
use tollgate_core::{AppId, PipelineName, ScopeId, Task, Timestamp};

const D: Dialect = Dialect::Sqlite;

fn args(sql: &ListSql) -> StoreResult<SqliteArguments> {
    let mut a = SqliteArguments::default();
    for arg in &sql.args {
        match arg {
            Arg::Text(s) => a.add(s.clone()),
            Arg::Int(i) => a.add(*i),
        }
        .map_err(|e| StoreError::Database(e.to_string()))?;
    }
    Ok(a)
}

impl SqliteStore {
    async fn rows_of<T>(&self, sql: ListSql) -> StoreResult<Vec<T>>
    where
        T: for<'r> FromRow<'r, SqliteRow> + Send + Unpin,
    {
        let a = args(&sql)?;
        Ok(
            sqlx::query_as_with::<Sqlite, T, _>(sqlx::AssertSqlSafe(sql.text), a)
                .fetch_all(&self.reader)
                .await?,
        )
    }
}

#[async_trait]
impl ListStore for SqliteStore {
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
        let cutoff = self.now().minus(ADMISSION_WINDOW);
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
        let now = self.now();
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
        let now = self.now();
        let since = since.unwrap_or_else(|| now.minus(std::time::Duration::from_secs(3600)));
        let counts: Vec<(String, i64)> =
            self.rows_of(crate::list::active_counts_sql(D, app)).await?;
        let rows: Vec<(String, Option<String>, bool, Option<i64>)> = self
            .rows_of(crate::list::finished_sql(D, app, since))
            .await?;
        Ok(crate::list::stats_of(now, &counts, rows))
    }
}

#[cfg(test)]
mod tests {
    //! SPEC §15: every listing statement is indexed on SQLite (EXPLAIN QUERY PLAN: every
    //! table is searched through an index, never scanned).
    use super::*;
    use crate::list::*;
    use tollgate_core::{RunId, RunState, SourceId, StepKey, TaskKind, TaskStatus};

    fn statements() -> Vec<ListSql> {
        let app = AppId::new("a").unwrap();
        let scope = ScopeId::new("s").unwrap();
        let cursor = ListCursor::Newest {
            listing: 't',
            at: Timestamp(5),
            id: "0190a0a0-0000-7000-8000-000000000000".into(),
        };
        let mut out = Vec::new();
        for q in [
            TaskListQuery::default(),
            TaskListQuery {
                scope: Some(scope.clone()),
                after: Some(cursor.clone()),
                ..Default::default()
            },
            TaskListQuery {
                statuses: vec![TaskStatus::Queued, TaskStatus::Failed],
                ..Default::default()
            },
            TaskListQuery {
                kind: Some(TaskKind::Classify),
                ..Default::default()
            },
            TaskListQuery {
                step: Some(StepKey::new("x").unwrap()),
                ..Default::default()
            },
            TaskListQuery {
                source: Some(SourceId::new("d").unwrap()),
                ..Default::default()
            },
            TaskListQuery {
                run: Some(RunId::generate()),
                ..Default::default()
            },
            TaskListQuery {
                created_after: Some(Timestamp(1)),
                created_before: Some(Timestamp(9)),
                ..Default::default()
            },
        ] {
            out.push(tasks_sql(D, &app, &q));
        }
        out.push(runs_sql(D, &app, &RunListQuery::default()));
        out.push(runs_sql(
            D,
            &app,
            &RunListQuery {
                scope: Some(scope.clone()),
                states: vec![RunState::Running],
                pipeline: Some(PipelineName::new("p").unwrap()),
                ..Default::default()
            },
        ));
        out.push(pipeline_names_sql(D, &app, None, 10));
        out.push(pipeline_versions_sql(D, &app, "a", "b"));
        out.push(scopes_sql(D, &app, Timestamp(0), None, 10));
        out.extend(scope_sqls(D, &app, &scope, Timestamp(0)));
        out.push(scope_steps_sql(D, &app, &scope, Timestamp(0)));
        out.push(active_counts_sql(D, &app));
        out.push(finished_sql(D, &app, Timestamp(0)));
        out
    }

    #[test]
    fn every_listing_statement_searches_an_index() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let dir = tempfile::tempdir().unwrap();
            let store = SqliteStore::open(crate::sqlite::SqliteOptions::new(
                dir.path().join("plan.db"),
            ))
            .await
            .unwrap();
            for sql in statements() {
                let mut explain = sql.clone();
                explain.text = format!("EXPLAIN QUERY PLAN {}", sql.text);
                let rows: Vec<(i64, i64, i64, String)> = store.rows_of(explain).await.unwrap();
                for (_, _, _, detail) in &rows {
                    assert!(
                        !detail.starts_with("SCAN"),
                        "{detail} in the plan of {}",
                        sql.text
                    );
                }
            }
        });
    }
}

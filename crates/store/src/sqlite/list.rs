//! docs/conformance.md#listings listings on SQLite: the shared statements of [`crate::list`] run on the read
//! pool (they decide nothing, so they never take the write lock); this module proves
//! each of them searches an index.

#[cfg(test)]
mod tests {
    //! docs/conformance.md#listings: every listing statement is indexed on SQLite (EXPLAIN QUERY PLAN: every
    //! table is searched through an index, never scanned).
    use super::super::SqliteStore;
    use crate::list::*;
    use crate::shared::sql::{Backend, Exec, Statement};
    use tollgate_core::{
        AppId, PipelineName, RunId, RunState, ScopeId, SourceId, StepKey, TaskKind, TaskStatus,
        Timestamp,
    };

    fn statements() -> Vec<Statement> {
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
                statuses: vec![TaskStatus::Succeeded, TaskStatus::Canceled],
                scope: Some(scope.clone()),
                ..Default::default()
            },
            TaskListQuery {
                kind: Some(TaskKind::Classify),
                ..Default::default()
            },
            TaskListQuery {
                step: Some(StepKey::new("x").unwrap()),
                after: Some(cursor.clone()),
                ..Default::default()
            },
            TaskListQuery {
                subject: Some(
                    tollgate_core::Subject::new(tollgate_core::SubjectKind::User, "u-1").unwrap(),
                ),
                source: Some(SourceId::new("d").unwrap()),
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
                error_code: Some("provider_error".into()),
                ..Default::default()
            },
            TaskListQuery {
                created_after: Some(Timestamp(1)),
                created_before: Some(Timestamp(9)),
                ..Default::default()
            },
        ] {
            if tasks_walked(&q) {
                out.push(task_walk_floor_sql(&app, &q));
            }
            out.push(tasks_sql(&app, &q));
        }
        out.push(runs_sql(&app, &RunListQuery::default()));
        out.push(runs_sql(
            &app,
            &RunListQuery {
                scope: Some(scope.clone()),
                states: vec![RunState::Running],
                pipeline: Some(PipelineName::new("p").unwrap()),
                ..Default::default()
            },
        ));
        out.push(pipeline_names_sql(&app, None, 10));
        out.push(pipeline_versions_sql(&app, "a", "b"));
        out.push(scopes_sql(&app, Timestamp(0), None, 10));
        out.extend(scope_sqls(&app, &scope, Timestamp(0)));
        out.push(scope_steps_sql(&app, &scope, Timestamp(0)));
        out.push(active_counts_sql(&app));
        out.push(finished_sql(&app, Timestamp(0)));
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
                explain.text = format!("EXPLAIN QUERY PLAN {}", sql.text).into();
                let rows: Vec<(i64, i64, i64, String)> = store.reader().all(explain).await.unwrap();
                for (_, _, _, detail) in &rows {
                    // `walk` is the inner select of a walked filter, LIMITed in index
                    // order: scanning its rows is bounded.
                    assert!(
                        !detail.starts_with("SCAN") || detail == "SCAN walk",
                        "{detail} in the plan of {}",
                        sql.text
                    );
                }
            }
        });
    }
}

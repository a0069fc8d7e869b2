//! Step 6 on SQLite: the task row and what follows it, in one query
//! (`sql/create_task.sql`).

use crate::StoreResult;
use crate::shared::admission::{InsertRow, TASK_INSERT, bind_join};
use crate::shared::cost::{SpendDelta, bind_spend};
use crate::shared::dispatch::QUEUE_JOIN;
use crate::shared::named::NamedStatement;
use crate::shared::rows::{TaskRow, task_columns};
use crate::shared::sql::Exec;
use crate::sqlite::lifecycle::OPEN_CLAIMED;
use sqlx::SqliteConnection;
use tollgate_core::cost::spend_bucket;
use tollgate_core::{SourceId, Task};

/// The spend upserts (`sql/spend_upserts.sql`), statements of the queries that reserve
/// or save.
pub(super) const SPEND_UPSERTS: &str = include_str!("../sql/spend_upserts.sql");

/// The task, a cache hit's saving, its queue's join and its admission record.
static CREATE_TASK: NamedStatement = NamedStatement::new(
    "create_task",
    include_str!("../sql/create_task.sql"),
    &[&[
        ("task_insert", TASK_INSERT),
        ("insert_if", "true"),
        ("created_at", ":now"),
        ("dispatch_key", ":dispatch_key"),
        ("task_columns", task_columns!()),
        ("spend_upserts", SPEND_UPSERTS),
        ("spend_when", ":saved_nano > 0"),
        ("queue_join", QUEUE_JOIN),
        ("open_claimed", OPEN_CLAIMED),
    ]],
);

/// The names [`insert_task`] binds of the admission record, after the row, spend and
/// join groups.
const ADMISSION_NAMES: &[&str] = &["source", "logical_key"];

/// Inserts the task and, in the same query (one hop to the connection's thread), what
/// follows it: a cache hit's saving in the spend buckets (docs/conformance.md#cost-cache-hits), a task created
/// claimed its first attempt, or a queued task's queue join (docs/conformance.md#fair-share) and `admission`
/// record (source and logical key). `None`: the effect key was taken, nothing written.
pub(super) async fn insert_task(
    conn: &mut SqliteConnection,
    i: &InsertRow<'_>,
    admission: Option<(&SourceId, String)>,
) -> StoreResult<Option<Task>> {
    let mut b = CREATE_TASK.binder();
    i.bind(&mut b, false);
    let saved = SpendDelta {
        saved_nano: i.saved_nano,
        ..SpendDelta::default()
    };
    bind_spend(&mut b, i.scope.as_str(), spend_bucket(i.now), saved);
    bind_join(&mut b, i.new.dispatch.weight);
    let (source, logical_key) = admission.map(|(s, k)| (s.as_str(), k)).unzip();
    b.group(ADMISSION_NAMES, |b| {
        b.bind("source", source).bind("logical_key", logical_key);
    });
    // The insert's row comes first; the statements after it return none.
    let rows: Vec<TaskRow> = conn.all(b.statement()?).await?;
    rows.into_iter().next().map(TaskRow::into_task).transpose()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shared::admission::{JOIN_NAMES, NOW_NAMES, ROW_NAMES};
    use crate::shared::cost::SPEND_NAMES;
    use crate::shared::named::check_binds;

    #[test]
    fn the_statement_and_its_binder_agree() {
        check_binds(
            &CREATE_TASK,
            &[
                ROW_NAMES,
                NOW_NAMES,
                SPEND_NAMES,
                JOIN_NAMES,
                ADMISSION_NAMES,
            ],
        );
    }
}

//! Listings (docs/conformance.md#listings): the queries, pages, opaque cursors and the dialect-free SQL both
//! backends run. Each listing is one indexed statement of the app's rows, newest first
//! (keyset on `(created_at, id)`, so pages never skip or repeat a row that existed when
//! the first page was read, whatever is inserted meanwhile). The backends only bind the
//! arguments built here ([`ListSql`]) and turn rows into answers.

use crate::StoreResult;
use async_trait::async_trait;
use tollgate_core::{
    AppId, InvalidInput, PipelineName, Run, RunId, RunState, ScopeId, SourceId, StepKey, Subject,
    Task, TaskKind, TaskStatus, Timestamp,
};

/// Largest page of a listing.
pub const LIST_MAX_PAGE: u32 = 500;
/// Page size when a listing names none.
pub const LIST_DEFAULT_PAGE: u32 = 50;
/// Most finished tasks [`ListStore::task_stats`] reads for its percentiles.
pub const STATS_SAMPLE: u32 = 10_000;

/// A page size as every docs/conformance.md#listings listing reads it: 0 means [`LIST_DEFAULT_PAGE`], larger
/// than [`LIST_MAX_PAGE`] is capped.
pub fn list_page_size(requested: u32) -> u32 {
    match requested {
        0 => LIST_DEFAULT_PAGE,
        n => n.min(LIST_MAX_PAGE),
    }
}

/// Where a keyset page ends: the sort key of its last row. Opaque to callers
/// ([`ListCursor::encode`]); a cursor of another listing is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListCursor {
    /// Tasks or runs: `(created_at, id)` of the last row, newest first.
    Newest {
        /// Which listing it came from (`t` tasks, `r` runs).
        listing: char,
        /// The last row's creation time.
        at: Timestamp,
        /// The last row's id.
        id: String,
    },
    /// Scopes or pipelines: the last name, in name order.
    Name {
        /// Which listing it came from (`s` scopes, `p` pipelines).
        listing: char,
        /// The last name shown.
        name: String,
    },
}

impl ListCursor {
    /// The cursor as text: opaque to callers, who pass it back as given. It reads
    /// `<listing>1.<created ms>.<id>` or `<listing>1.<name>`, so the OpenAPI document can
    /// say exactly which texts are cursors.
    pub fn encode(&self) -> String {
        match self {
            ListCursor::Newest { listing, at, id } => format!("{listing}1.{}.{id}", at.0),
            ListCursor::Name { listing, name } => format!("{listing}1.{name}"),
        }
    }

    /// Reads a cursor `listing` gave out; anything else is [`InvalidInput`] on `next`.
    pub fn decode(text: &str, listing: char) -> Result<ListCursor, InvalidInput> {
        let bad = || InvalidInput::field("next", "not a cursor this listing gave out");
        let rest = text
            .strip_prefix(listing)
            .and_then(|r| r.strip_prefix("1."))
            .ok_or_else(bad)?;
        match listing {
            't' | 'r' => {
                let (at, id) = rest.split_once('.').ok_or_else(bad)?;
                if at.is_empty() || at.len() > 16 {
                    return Err(bad());
                }
                let at: i64 = at.parse().map_err(|_| bad())?;
                let id = if listing == 't' {
                    tollgate_core::TaskId::parse(id).map(|i| i.to_string())
                } else {
                    RunId::parse(id).map(|i| i.to_string())
                }
                .map_err(|_| bad())?;
                Ok(ListCursor::Newest {
                    listing,
                    at: Timestamp(at),
                    id,
                })
            }
            _ => {
                tollgate_core::ids::check_identifier("next", rest).map_err(|_| bad())?;
                Ok(ListCursor::Name {
                    listing,
                    name: rest.to_string(),
                })
            }
        }
    }
}

/// Query of [`ListStore::list_tasks`]. Every filter narrows; none given lists the app's
/// tasks.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TaskListQuery {
    /// Only this scope.
    pub scope: Option<ScopeId>,
    /// Only these statuses (empty: any).
    pub statuses: Vec<TaskStatus>,
    /// Only this kind.
    pub kind: Option<TaskKind>,
    /// Only this step key.
    pub step: Option<StepKey>,
    /// Only this source.
    pub source: Option<SourceId>,
    /// Only tasks of this run.
    pub run: Option<RunId>,
    /// Created at or after this instant.
    pub created_after: Option<Timestamp>,
    /// Created before this instant.
    pub created_before: Option<Timestamp>,
    /// Only tasks done for this subject (a caller bound to a subject sees only its own).
    pub subject: Option<Subject>,
    /// Only tasks that ended with this error code (failed or canceled ones;
    /// `WORKFLOW_AI_INTERRUPTED` also matches those that ended without a code, as the
    /// stats count them).
    pub error_code: Option<String>,
    /// Keyset cursor: the page after this one.
    pub after: Option<ListCursor>,
    /// Page size as [`list_page_size`] reads it.
    pub limit: u32,
}

/// Query of [`ListStore::list_runs`].
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RunListQuery {
    /// Only this scope.
    pub scope: Option<ScopeId>,
    /// Only these states (empty: any).
    pub states: Vec<RunState>,
    /// Only runs of this pipeline.
    pub pipeline: Option<PipelineName>,
    /// Only runs done for this subject.
    pub subject: Option<Subject>,
    /// Keyset cursor.
    pub after: Option<ListCursor>,
    /// Page size as [`list_page_size`] reads it.
    pub limit: u32,
}

/// A page of a listing: rows in order, and the cursor of the next page (`None` on the
/// last one).
#[derive(Debug, Clone, PartialEq)]
pub struct ListPage<T> {
    /// The rows.
    pub items: Vec<T>,
    /// Where the next page starts.
    pub next: Option<ListCursor>,
}

/// A run in a listing, with the pipeline it runs (if any).
#[derive(Debug, Clone, PartialEq)]
pub struct ListedRun {
    /// The run.
    pub run: Run,
    /// Pipeline name and version, for pipeline runs.
    pub pipeline: Option<crate::PipelineRef>,
}

/// One version of a pipeline in [`ListStore::list_pipelines`].
#[derive(Debug, Clone, PartialEq)]
pub struct PipelineVersionSummary {
    /// Content hash.
    pub version: String,
    /// When it was registered.
    pub created_at: Timestamp,
}

/// A pipeline name with its versions, newest first.
#[derive(Debug, Clone, PartialEq)]
pub struct PipelineSummary {
    /// The name.
    pub name: PipelineName,
    /// Its versions, newest first (the first is what a run without a version runs).
    pub versions: Vec<PipelineVersionSummary>,
}

/// What the store keeps about a scope's admission (docs/conformance.md#admission), read without changing it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ScopeSnapshot {
    /// The scope.
    pub scope: Option<ScopeId>,
    /// "Now" as the store's clock read it for this snapshot.
    pub now: Option<Timestamp>,
    /// Token bucket as last stored (units of `TOKEN_UNITS`) and when; `None` before the
    /// scope's first admission.
    pub bucket: Option<tollgate_core::admission::BucketState>,
    /// Admitted tasks still queued or running.
    pub active: u64,
    /// Distinct sources admitted in the 24 h window.
    pub sources_in_window: u64,
    /// Distinct logical steps admitted in the window (all sources).
    pub steps_in_window: u64,
    /// The most distinct steps one source has in the window (what the per-source limit
    /// compares).
    pub busiest_source_steps: u64,
    /// Admission records in the window.
    pub admissions_in_window: u64,
    /// The newest admission in the window.
    pub last_admitted_at: Option<Timestamp>,
}

/// One finished task as [`ListStore::task_stats`] reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct FinishedSample {
    /// Its terminal status.
    pub status: TaskStatus,
    /// The error code, when failed or canceled.
    pub error_code: Option<String>,
    /// Served from the cache.
    pub cached: bool,
    /// Claimed → finished, in milliseconds (tasks a worker ran).
    pub run_ms: Option<i64>,
    /// When it finished.
    pub completed_at: Timestamp,
}

/// Raw counts of an app's tasks for `GET /v1/stats`; the engine aggregates them.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TaskStatsRaw {
    /// "Now" as the store's clock reads it.
    pub now: Option<Timestamp>,
    /// Tasks queued now.
    pub queued: u64,
    /// Tasks running now.
    pub running: u64,
    /// Tasks that finished since the window's start, newest first (at most
    /// [`STATS_SAMPLE`]).
    pub finished: Vec<FinishedSample>,
    /// Whether more finished in the window than `finished` holds.
    pub truncated: bool,
}

/// The docs/conformance.md#listings listings. Every method reads only the app's rows; another app's rows
/// never appear. Each is one indexed statement (plus bounded lookups per page).
#[async_trait]
pub trait ListStore: Send + Sync {
    /// The app's tasks, newest first, filtered.
    async fn list_tasks(&self, app: &AppId, query: &TaskListQuery) -> StoreResult<ListPage<Task>>;

    /// The app's runs, newest first, filtered.
    async fn list_runs(
        &self,
        app: &AppId,
        query: &RunListQuery,
    ) -> StoreResult<ListPage<ListedRun>>;

    /// The app's pipelines in name order with their versions.
    async fn list_pipelines(
        &self,
        app: &AppId,
        after: Option<&ListCursor>,
        limit: u32,
    ) -> StoreResult<ListPage<PipelineSummary>>;

    /// The app's scopes with admission activity in the 24 h window (admitted tasks still
    /// active, or a source admitted in the window), in name order.
    async fn list_scopes(
        &self,
        app: &AppId,
        after: Option<&ListCursor>,
        limit: u32,
    ) -> StoreResult<ListPage<ScopeSnapshot>>;

    /// One scope's admission state (zeros for a scope never admitted into).
    async fn scope_snapshot(&self, app: &AppId, scope: &ScopeId) -> StoreResult<ScopeSnapshot>;

    /// Queued and running counts now, and the tasks that finished since `since`.
    async fn task_stats(&self, app: &AppId, since: Option<Timestamp>) -> StoreResult<TaskStatsRaw>;
}

mod statements;

pub use statements::LIST_WALK;
pub(crate) use statements::*;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_refuse_other_listings() {
        let c = ListCursor::Name {
            listing: 's',
            name: "scope-1".into(),
        };
        assert_eq!(ListCursor::decode(&c.encode(), 's').unwrap(), c);
        assert!(ListCursor::decode(&c.encode(), 'p').is_err());
        assert!(ListCursor::decode("zz", 's').is_err());
        assert!(ListCursor::decode("t1.12.not-an-id", 't').is_err());
        let t = ListCursor::Newest {
            listing: 't',
            at: Timestamp(12),
            id: "0190a0a0-0000-7000-8000-000000000000".into(),
        };
        assert_eq!(ListCursor::decode(&t.encode(), 't').unwrap(), t);
        assert!(ListCursor::decode(&t.encode(), 'r').is_err());
        assert!(ListCursor::decode("", 't').is_err());
    }

    #[test]
    fn page_sizes() {
        assert_eq!(list_page_size(0), LIST_DEFAULT_PAGE);
        assert_eq!(list_page_size(9_999), LIST_MAX_PAGE);
        assert_eq!(list_page_size(3), 3);
    }
}

//! SPEC §4's facts in one statement under the scope's advisory lock; the decision is
//! core's, through [`AdmissionFacts::decide`].

use super::super::Tx;
use crate::StoreResult;
use crate::shared::admission::{AdmissionFacts, ScopeUpdate};
use tollgate_core::admission::ADMISSION_WINDOW;
use tollgate_core::{AdmissionRejection, AppId, Budget, ScopeId, SourceId, Timestamp};

/// SPEC §4 under the scope lock: prunes the scope's expired sightings, reads the
/// snapshot, asks core (through [`AdmissionFacts::decide`]), and on admission stores the bucket, the counters and
/// the sighting. The global cap is enforced again by the final conditional increment.
pub(super) async fn admit(
    tx: &mut Tx,
    app: &AppId,
    scope: &ScopeId,
    source: &SourceId,
    logical_key: &str,
    budget: &Budget,
    now: Timestamp,
) -> StoreResult<Result<ScopeUpdate, AdmissionRejection>> {
    let cutoff = now.minus(ADMISSION_WINDOW).0;
    // The prune and the snapshot are one statement: the snapshot sees the sightings as
    // they were before the prune, and counts only those newer than the cutoff anyway.
    let facts: AdmissionFacts = sqlx::query_as(
        "WITH pruned AS (DELETE FROM scope_sources \
           WHERE app = $1 AND scope = $2 AND last_admitted_at <= $4 RETURNING 1) \
         SELECT (SELECT COUNT(*) FROM pruned)::BIGINT AS pruned, \
         s.bucket_units, s.bucket_at, s.sources_in_window, s.active, \
         EXISTS (SELECT 1 FROM scope_sources WHERE app = $1 AND scope = $2 AND source_id = $3 \
                 AND last_admitted_at > $4) AS seen, \
         (SELECT COUNT(DISTINCT logical_key) FROM admissions WHERE app = $1 AND scope = $2 \
                 AND source_id = $3 AND admitted_at > $4 AND logical_key IS NOT NULL) AS steps, \
         EXISTS (SELECT 1 FROM admissions WHERE app = $1 AND scope = $2 AND source_id = $3 \
                 AND admitted_at > $4 AND logical_key = $5) AS counted, \
         (SELECT COALESCE(SUM(admitted), 0)::BIGINT FROM global_slots) \
           - (SELECT COALESCE(SUM(finished), 0)::BIGINT FROM global_finished) AS global_active \
         FROM (SELECT 1) AS one LEFT JOIN scope_state s ON s.app = $1 AND s.scope = $2",
    )
    .bind(app.as_str())
    .bind(scope.as_str())
    .bind(source.as_str())
    .bind(cutoff)
    .bind(logical_key)
    .fetch_one(&mut **tx)
    .await?;
    Ok(facts.decide(budget, now))
}

//! docs/conformance.md#provider-pace provider pace on PostgreSQL ([`PaceStore`]): one row per schedule, moved by
//! single statements under its row lock (rows locked in key order), times from the
//! database's clock (or the configured test clock) in microseconds.

use super::PostgresStore;
use crate::{PaceSlot, PaceStore, StoreResult};
use async_trait::async_trait;
use std::time::Duration;

/// SQL for "now" in microseconds: `$n` (the fixed clock, in milliseconds) when bound,
/// else the database's clock.
macro_rules! now_us_sql {
    ($n:literal) => {
        concat!(
            "COALESCE($",
            $n,
            "::BIGINT * 1000, (EXTRACT(EPOCH FROM clock_timestamp()) * 1000000)::BIGINT)"
        )
    };
}

fn wait(us: i64) -> Duration {
    Duration::from_micros(u64::try_from(us).unwrap_or(0))
}

impl PostgresStore {
    async fn ensure_pace_rows(&self, keys: &[&str]) -> StoreResult<()> {
        sqlx::query(
            "INSERT INTO provider_pace (pace_key) SELECT k FROM UNNEST($1::TEXT[]) AS k \
             ORDER BY k ON CONFLICT (pace_key) DO NOTHING",
        )
        .bind(keys)
        .execute(&self.pool)
        .await?;
        Ok(())
    }
}

#[async_trait]
impl PaceStore for PostgresStore {
    async fn reserve_pace(&self, slots: &[PaceSlot]) -> StoreResult<Duration> {
        if slots.is_empty() {
            return Ok(Duration::ZERO);
        }
        let keys: Vec<&str> = slots.iter().map(|s| s.key.as_str()).collect();
        let requests: Vec<i64> = slots.iter().map(|s| s.request_cost_us).collect();
        let tokens: Vec<i64> = slots.iter().map(|s| s.token_cost_us).collect();
        for attempt in 0..2 {
            // The call starts at the latest, over its schedules, of the next request
            // start, the next token start, the pause and now; every schedule moves on
            // from that common start (so a call delayed by one schedule never bunches
            // up on another).
            let (n, longest): (i64, Option<i64>) = sqlx::query_as(concat!(
                "WITH clock AS (SELECT ",
                now_us_sql!(4),
                " AS now), \
                 s AS (SELECT * FROM UNNEST($1::TEXT[], $2::BIGINT[], $3::BIGINT[]) \
                   AS s(k, rc, tc)), \
                 locked AS (SELECT p.pace_key, \
                   GREATEST(p.request_tat, p.token_tat, p.paused_until, clock.now) AS ready \
                   FROM provider_pace p JOIN s ON p.pace_key = s.k CROSS JOIN clock \
                   ORDER BY p.pace_key FOR UPDATE OF p), \
                 start AS (SELECT MAX(ready) AS at FROM locked), \
                 moved AS (UPDATE provider_pace p SET request_tat = start.at + s.rc, \
                   token_tat = start.at + s.tc \
                   FROM s, start, locked l WHERE p.pace_key = s.k AND l.pace_key = p.pace_key \
                   RETURNING p.pace_key) \
                 SELECT (SELECT COUNT(*) FROM moved), \
                   (SELECT start.at - clock.now FROM start, clock)"
            ))
            .bind(&keys)
            .bind(&requests)
            .bind(&tokens)
            .bind(self.fixed_now())
            .fetch_one(&self.pool)
            .await?;
            if n as usize == slots.len() || attempt == 1 {
                return Ok(wait(longest.unwrap_or(0)));
            }
            // A schedule's first call: create its rows, then take the start.
            self.ensure_pace_rows(&keys).await?;
        }
        Ok(Duration::ZERO)
    }

    async fn settle_pace(&self, key: &str, delta_us: i64) -> StoreResult<()> {
        if delta_us == 0 {
            return Ok(());
        }
        sqlx::query(concat!(
            "UPDATE provider_pace SET token_tat = GREATEST(token_tat + $2, ",
            now_us_sql!(3),
            ") WHERE pace_key = $1"
        ))
        .bind(key)
        .bind(delta_us)
        .bind(self.fixed_now())
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn pause_pace(&self, key: &str, pause: Duration) -> StoreResult<()> {
        let pause_us = i64::try_from(pause.as_micros()).unwrap_or(i64::MAX / 2);
        sqlx::query(concat!(
            "INSERT INTO provider_pace (pace_key, paused_until) VALUES ($1, ",
            now_us_sql!(3),
            " + $2) ON CONFLICT (pace_key) DO UPDATE SET \
             paused_until = GREATEST(provider_pace.paused_until, EXCLUDED.paused_until)"
        ))
        .bind(key)
        .bind(pause_us)
        .bind(self.fixed_now())
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn pace_pause_left(&self, keys: &[String]) -> StoreResult<Duration> {
        if keys.is_empty() {
            return Ok(Duration::ZERO);
        }
        let left: Option<i64> = sqlx::query_scalar(concat!(
            "SELECT MAX(paused_until) - ",
            now_us_sql!(2),
            " FROM provider_pace WHERE pace_key = ANY($1)"
        ))
        .bind(keys)
        .bind(self.fixed_now())
        .fetch_one(&self.pool)
        .await?;
        Ok(wait(left.unwrap_or(0)))
    }

    async fn pace_pauses_left(&self, keys: &[String]) -> StoreResult<Vec<Duration>> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let left: Vec<Option<i64>> = sqlx::query_scalar(concat!(
            "SELECT p.paused_until - ",
            now_us_sql!(2),
            " FROM UNNEST($1::TEXT[]) WITH ORDINALITY AS k(key, n) \
             LEFT JOIN provider_pace p ON p.pace_key = k.key ORDER BY k.n"
        ))
        .bind(keys)
        .bind(self.fixed_now())
        .fetch_all(&self.pool)
        .await?;
        Ok(left.into_iter().map(|us| wait(us.unwrap_or(0))).collect())
    }
}

//! docs/conformance.md#provider-pace provider pace on SQLite ([`PaceStore`]): the same rows and arithmetic as
//! PostgreSQL, under the writer lock, times from the store's clock in microseconds.

use super::SqliteStore;
use crate::{PaceSlot, PaceStore, StoreResult};
use async_trait::async_trait;
use std::time::Duration;

fn wait(us: i64) -> Duration {
    Duration::from_micros(u64::try_from(us).unwrap_or(0))
}

impl SqliteStore {
    fn now_us(&self) -> i64 {
        self.now().0.saturating_mul(1000)
    }
}

#[async_trait]
impl PaceStore for SqliteStore {
    async fn reserve_pace(&self, slots: &[PaceSlot]) -> StoreResult<Duration> {
        if slots.is_empty() {
            return Ok(Duration::ZERO);
        }
        let mut tx = self.begin().await?;
        let now = self.now_us();
        // The latest, over the call's schedules, of the next request start, the next
        // token start, the pause and now; every schedule moves on from there.
        let mut start = now;
        for slot in slots {
            sqlx::query("INSERT INTO provider_pace (pace_key) VALUES (?) ON CONFLICT DO NOTHING")
                .bind(&slot.key)
                .execute(&mut *tx)
                .await?;
            let ready: i64 = sqlx::query_scalar(
                "SELECT MAX(request_tat, token_tat, paused_until) FROM provider_pace \
                 WHERE pace_key = ?",
            )
            .bind(&slot.key)
            .fetch_one(&mut *tx)
            .await?;
            start = start.max(ready);
        }
        for slot in slots {
            sqlx::query(
                "UPDATE provider_pace SET request_tat = ?1 + ?2, token_tat = ?1 + ?3 \
                 WHERE pace_key = ?4",
            )
            .bind(start)
            .bind(slot.request_cost_us)
            .bind(slot.token_cost_us)
            .bind(&slot.key)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(wait(start - now))
    }

    async fn settle_pace(&self, key: &str, delta_us: i64) -> StoreResult<()> {
        if delta_us == 0 {
            return Ok(());
        }
        let mut tx = self.begin().await?;
        sqlx::query(
            "UPDATE provider_pace SET token_tat = MAX(token_tat + ?, ?) WHERE pace_key = ?",
        )
        .bind(delta_us)
        .bind(self.now_us())
        .bind(key)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn pause_pace(&self, key: &str, pause: Duration) -> StoreResult<()> {
        let until = self
            .now_us()
            .saturating_add(i64::try_from(pause.as_micros()).unwrap_or(i64::MAX / 2));
        let mut tx = self.begin().await?;
        sqlx::query(
            "INSERT INTO provider_pace (pace_key, paused_until) VALUES (?1, ?2) \
             ON CONFLICT (pace_key) DO UPDATE SET paused_until = MAX(paused_until, ?2)",
        )
        .bind(key)
        .bind(until)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// The longest of [`pace_pauses_left`](PaceStore::pace_pauses_left)'s pauses.
    async fn pace_pause_left(&self, keys: &[String]) -> StoreResult<Duration> {
        let left = self.pace_pauses_left(keys).await?;
        Ok(left.into_iter().max().unwrap_or(Duration::ZERO))
    }

    async fn pace_pauses_left(&self, keys: &[String]) -> StoreResult<Vec<Duration>> {
        let mut left = Vec::with_capacity(keys.len());
        for key in keys {
            let until: Option<i64> =
                sqlx::query_scalar("SELECT paused_until FROM provider_pace WHERE pace_key = ?")
                    .bind(key)
                    .fetch_optional(&self.reader)
                    .await?;
            left.push(wait(until.unwrap_or(0) - self.now_us()));
        }
        Ok(left)
    }
}

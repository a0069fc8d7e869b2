//! PostgreSQL `LISTEN/NOTIFY` for the engine's notifications across replicas.
//!
//! Notifications are hints, never the truth: a listener that loses its connection misses
//! what was sent meanwhile, and every waiter polls the database at a bounded interval
//! anyway. Channels are database-wide while Tollgate's tables live in a schema, so the
//! channel name is derived from the schema (`current_schema()`): replicas sharing one
//! schema hear each other, tests in their own schemas do not.

use super::PostgresStore;
use crate::{StoreError, StoreResult};
use sqlx::postgres::{PgListener, PgPool, PgPoolOptions};

/// The channel of one Tollgate schema, and the means to publish on it and listen to it.
#[derive(Debug, Clone)]
pub struct PgNotifications {
    pool: PgPool,
    channel: String,
}

impl PgNotifications {
    /// The channel of the store's schema. Publishing uses the store's pool; each
    /// [`listen`](Self::listen) opens its own dedicated connection.
    pub async fn new(store: &PostgresStore) -> StoreResult<PgNotifications> {
        let schema: String = sqlx::query_scalar("SELECT current_schema()::TEXT")
            .fetch_one(store.pool())
            .await?;
        Ok(PgNotifications {
            pool: store.pool().clone(),
            channel: channel_for(&schema),
        })
    }

    /// The channel name (`tollgate_<hash of the schema>`, well under 63 bytes).
    pub fn channel(&self) -> &str {
        &self.channel
    }

    /// Sends `payload` (at most 7,999 bytes, PostgreSQL's limit) to every listener of the
    /// channel. Delivered when this statement commits, which is at once.
    pub async fn notify(&self, payload: &str) -> StoreResult<()> {
        if payload.len() >= 8000 {
            return Err(StoreError::Database(format!(
                "notification payload is {} bytes, over PostgreSQL's limit of 7999",
                payload.len()
            )));
        }
        sqlx::query("SELECT pg_notify($1, $2)")
            .bind(&self.channel)
            .bind(payload)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Starts listening on a dedicated connection (not taken from the store's pool).
    pub async fn listen(&self) -> StoreResult<PgNotificationStream> {
        let options = (*self.pool.connect_options()).clone();
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .max_lifetime(None)
            .idle_timeout(None)
            .connect_with(options)
            .await?;
        let mut listener = PgListener::connect_with(&pool).await?;
        listener.listen(&self.channel).await?;
        Ok(PgNotificationStream {
            listener,
            _pool: pool,
        })
    }
}

/// Notifications arriving on one channel.
#[derive(Debug)]
pub struct PgNotificationStream {
    listener: PgListener,
    _pool: PgPool,
}

impl PgNotificationStream {
    /// The next payload. A lost connection is re-established transparently (what was
    /// sent meanwhile is lost); an error means the database cannot be reached now.
    pub async fn recv(&mut self) -> StoreResult<String> {
        let notification = self.listener.recv().await?;
        Ok(notification.payload().to_string())
    }
}

/// `tollgate_` and 16 hex digits of the FNV-1a hash of the schema name.
fn channel_for(schema: &str) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in schema.as_bytes() {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("tollgate_{hash:016x}")
}

#[cfg(test)]
mod tests {
    use super::channel_for;

    #[test]
    fn channels_differ_per_schema_and_fit_an_identifier() {
        let a = channel_for("public");
        assert_ne!(a, channel_for("t_other"));
        assert_eq!(a, channel_for("public"));
        assert!(a.len() < 63);
    }
}

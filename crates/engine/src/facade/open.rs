//! [`Tollgate::open`](super::Tollgate::open): a database and its notifier from a URL.

use crate::config::{EngineConfig, TransportKind};
use crate::error::EngineError;
use crate::notify::Notifier;
use std::sync::Arc;
use tollgate_core::InvalidInput;
use tollgate_store::Store;
#[cfg(feature = "postgres")]
use tollgate_store::postgres::{PostgresOptions, PostgresStore};
#[cfg(feature = "sqlite")]
use tollgate_store::sqlite::{SqliteOptions, SqliteStore};

/// A store and its notifier, as [`Tollgate::open`](super::Tollgate::open) builds them.
type Opened = (Arc<dyn Store>, Notifier);

/// The PostgreSQL database at `database_url`, with the configured notifier (which may be
/// the database's own `LISTEN/NOTIFY`).
#[cfg(feature = "postgres")]
pub(super) async fn open_postgres(
    database_url: &str,
    config: &EngineConfig,
) -> Result<Opened, EngineError> {
    let mut options = PostgresOptions::new(database_url);
    options.claim_order = config.dispatch.claim_order();
    let store = PostgresStore::open(options).await?;
    let notifier = match config.notifications.transport {
        TransportKind::Postgres => Notifier::postgres(&store).await?,
        _ => notifier_for(config).await?,
    };
    Ok((Arc::new(store), notifier))
}

/// A build without the `postgres` feature cannot open PostgreSQL.
#[cfg(not(feature = "postgres"))]
pub(super) async fn open_postgres(
    _database_url: &str,
    _config: &EngineConfig,
) -> Result<Opened, EngineError> {
    Err(InvalidInput::field(
        "database_url",
        "is PostgreSQL, but this build has no PostgreSQL backend (cargo feature `postgres`)",
    )
    .into())
}

/// The SQLite file `database_url` names (`sqlite://path`, `sqlite:path` or a plain path),
/// created if missing, with the configured notifier.
pub(super) async fn open_sqlite(
    database_url: &str,
    config: &EngineConfig,
) -> Result<Opened, EngineError> {
    if config.notifications.transport == TransportKind::Postgres {
        return Err(crate::config::ConfigError::at(
            "notifications.transport",
            "`postgres` needs a PostgreSQL database",
        )
        .into());
    }
    let path = database_url
        .strip_prefix("sqlite://")
        .or_else(|| database_url.strip_prefix("sqlite:"))
        .unwrap_or(database_url);
    if path.is_empty() {
        return Err(InvalidInput::field("database_url", "names no file").into());
    }
    #[cfg(feature = "sqlite")]
    {
        let mut options = SqliteOptions::new(path);
        options.claim_order = config.dispatch.claim_order();
        let store = SqliteStore::open(options).await?;
        Ok((Arc::new(store), notifier_for(config).await?))
    }
    #[cfg(not(feature = "sqlite"))]
    {
        Err(InvalidInput::field(
            "database_url",
            "is SQLite, but this build has no SQLite backend (cargo feature `sqlite`)",
        )
        .into())
    }
}

async fn notifier_for(config: &EngineConfig) -> Result<Notifier, EngineError> {
    match config.notifications.transport {
        TransportKind::Local => Ok(Notifier::local()),
        TransportKind::Nats => {
            Notifier::nats(
                &config.notifications.nats_url,
                &config.notifications.subject_prefix,
            )
            .await
        }
        TransportKind::Postgres => Err(crate::config::ConfigError::at(
            "notifications.transport",
            "`postgres` needs a PostgreSQL database",
        )
        .into()),
    }
}

//! The fresh database each scenario runs on, dropped at its end.

use crate::BackendKind;
use crate::baseline::{Baseline, create_postgres_database, drop_postgres_database};
use anyhow::Context;
use std::sync::Arc;
use tollgate_store::Store;
use tollgate_store::postgres::{PostgresOptions, PostgresStore};
use tollgate_store::sqlite::{SqliteOptions, SqliteStore};

/// A fresh database for one scenario.
pub(crate) struct BenchDb {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) baseline: Baseline,
    place: Place,
}

pub(crate) enum Place {
    Sqlite {
        store: SqliteStore,
        /// Deleted with the `BenchDb`.
        _dir: tempfile::TempDir,
    },
    Postgres {
        store: PostgresStore,
        /// The server's URL the database was created through (and is dropped through).
        admin_url: String,
        name: String,
    },
}

impl BenchDb {
    /// SQLite: a new file in a temporary folder; PostgreSQL: `CREATE DATABASE` with a
    /// random name on the server of `url`.
    pub(crate) async fn create(backend: BackendKind, url: &str) -> anyhow::Result<BenchDb> {
        match backend {
            BackendKind::Sqlite => {
                let dir = tempfile::Builder::new()
                    .prefix("tollgate-bench-")
                    .tempdir()
                    .context("cannot create a temporary folder")?;
                let store = SqliteStore::open(SqliteOptions::new(dir.path().join("bench.db")))
                    .await
                    .context("cannot create the SQLite database")?;
                let baseline = Baseline::sqlite(&store);
                baseline.prepare().await?;
                Ok(BenchDb {
                    store: Arc::new(store.clone()),
                    baseline,
                    place: Place::Sqlite { store, _dir: dir },
                })
            }
            BackendKind::Postgres => {
                let name = format!("tollgate_bench_{}", uuid::Uuid::new_v4().simple());
                create_postgres_database(url, &name)
                    .await
                    .with_context(|| format!("cannot create a database at {}", redact(url)))?;
                let mut options = PostgresOptions::new(with_database(url, &name)?);
                options.application_name = "tollgate-bench".to_string();
                let store = match PostgresStore::open(options).await {
                    Ok(store) => store,
                    Err(e) => {
                        let _ = drop_postgres_database(url, &name).await;
                        return Err(e)
                            .with_context(|| format!("cannot open the benchmark database {name}"));
                    }
                };
                let baseline = Baseline::postgres(&store);
                let db = BenchDb {
                    store: Arc::new(store.clone()),
                    baseline,
                    place: Place::Postgres {
                        store,
                        admin_url: url.to_string(),
                        name,
                    },
                };
                if let Err(e) = db.baseline.prepare().await {
                    let _ = db.drop().await;
                    return Err(e.into());
                }
                Ok(db)
            }
        }
    }

    /// The same database (same pool) through a store claiming in `order`.
    pub(crate) fn store_ordered(&self, order: tollgate_store::ClaimOrder) -> Arc<dyn Store> {
        match &self.place {
            Place::Sqlite { store, .. } => Arc::new(store.clone().with_claim_order(order)),
            Place::Postgres { store, .. } => Arc::new(store.clone().with_claim_order(order)),
        }
    }

    /// Closes the database and deletes it.
    pub(crate) async fn drop(&self) -> anyhow::Result<()> {
        match &self.place {
            // The temporary folder goes with the BenchDb.
            Place::Sqlite { store, .. } => {
                store.close().await;
                Ok(())
            }
            Place::Postgres {
                store,
                admin_url,
                name,
            } => {
                store.close().await;
                drop_postgres_database(admin_url, name)
                    .await
                    .with_context(|| format!("cannot drop the benchmark database {name}"))
            }
        }
    }
}

/// `url` with its database replaced by `name` (query parameters kept).
pub(crate) fn with_database(url: &str, name: &str) -> anyhow::Result<String> {
    let scheme = url
        .find("://")
        .ok_or_else(|| anyhow::anyhow!("{} is not a postgres:// URL", redact(url)))?;
    let rest = &url[scheme + 3..];
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (head, tail) = url.split_at(scheme + 3 + authority_end);
    let query = tail.find('?').map_or("", |q| &tail[q..]);
    Ok(format!("{head}/{name}{query}"))
}

/// A database URL without its password, for messages.
pub(crate) fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &url[scheme + 3..at];
            match userinfo.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..scheme + 3], &url[at..]),
                None => url.to_string(),
            }
        }
        _ => url.to_string(),
    }
}

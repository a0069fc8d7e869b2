//! The conformance suite on the embedded SQLite backend: every test gets a fresh database
//! file in its own temporary folder.

use async_trait::async_trait;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tempfile::TempDir;
use tollgate_conformance::{Backend, START};
use tollgate_core::ManualClock;
use tollgate_store::Store;
use tollgate_store::sqlite::{SqliteOptions, SqliteStore};

/// One test's SQLite database.
struct SqliteBackend {
    path: PathBuf,
    clock: ManualClock,
    // Deleted when the test ends.
    _dir: TempDir,
}

#[async_trait]
impl Backend for SqliteBackend {
    async fn open(&self) -> Arc<dyn Store> {
        let mut options =
            SqliteOptions::new(self.path.clone()).with_clock(Arc::new(self.clock.clone()));
        // Racing tests hold many writers on one file: let them queue rather than fail.
        options.busy_timeout = Duration::from_secs(30);
        let store = SqliteStore::open(options)
            .await
            .unwrap_or_else(|e| panic!("cannot open {}: {e}", self.path.display()));
        Arc::new(store)
    }

    fn clock(&self) -> &ManualClock {
        &self.clock
    }
}

async fn backend(test_name: &str) -> Option<SqliteBackend> {
    let dir = tempfile::Builder::new()
        .prefix(&format!("tollgate-{test_name}-"))
        .tempdir()
        .expect("temporary folder");
    Some(SqliteBackend {
        path: dir.path().join("tollgate.db"),
        clock: ManualClock::new(START),
        _dir: dir,
    })
}

tollgate_conformance::conformance_suite!(backend);

//! The conformance suite: SPEC §3–8 written once against [`Store`], run by every backend.
//!
//! A backend's test file implements [`Backend`] and calls [`conformance_suite!`]
//! (`crate::conformance_suite`), which expands to one `#[tokio::test]` per rule so each
//! passes or fails on its own and they run in parallel. `docs/conformance.md` maps every
//! SPEC row to these names.

use crate::Store;
use async_trait::async_trait;
use std::sync::Arc;
use tollgate_core::ManualClock;

/// One test's database, as a backend provides it.
#[async_trait]
pub trait Backend: Send + Sync {
    /// A new, independent store instance (its own connection pool) on this test's
    /// database. Every instance reads [`Backend::clock`].
    async fn open(&self) -> Arc<dyn Store>;

    /// The clock every instance of this test's database reads; tests move it instead of
    /// sleeping.
    fn clock(&self) -> &ManualClock;
}

//! Tollgate's engine: what makes stored tasks actually run.
//!
//! [`Tollgate`] is the one facade an HTTP server, a CLI or an embedding Rust program
//! uses: submit (one or a batch), get, wait, cancel, release, delete owner data, list
//! unreleased sources, workflow runs, declarative pipelines over runs
//! ([`Tollgate::register_pipeline`], [`Tollgate::start_pipeline_run`]), and
//! [`Tollgate::start`] for this process's workers, sweeper and pipeline driver. Configuration ([`EngineConfig`]) resolves model ids to model refs and
//! config hashes ([`ModelRegistry`]) and budget policy names to budgets
//! ([`BudgetPolicies`]). Providers ([`provider`]) call the models: any OpenAI-compatible
//! API, or the offline `dev` provider. Notifications ([`notify`]) make things fast within
//! a process and across replicas (NATS or PostgreSQL `LISTEN/NOTIFY`); the database stays
//! the truth.
//!
//! ## Embedding
//!
//! `tollgate-engine` is the one crate an embedding program needs: [`prelude`] names the
//! engine's types and the core and store types its signatures use (ids, owners, kinds and
//! their typed requests, tasks, usage, errors, configuration).
//!
//! ```no_run
//! use std::time::Duration;
//! use tollgate_engine::prelude::*;
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let tollgate = Tollgate::open("sqlite://tollgate.db", EngineConfig::default()).await?;
//! let workers = tollgate.start().await?;
//! let app = AppId::new("acme")?;
//! let request = ClassifyRequest {
//!     input: "Win a free cruise!".into(),
//!     labels: vec![Label::Name("spam".into()), Label::Name("ham".into())],
//!     instructions: None,
//! };
//! let submission = Submission::classify(
//!     app.clone(),
//!     ScopeId::new("customer-42")?,
//!     EffectKey::new("label-email-981")?,
//!     request,
//! );
//! match tollgate.submit(submission).await {
//!     Ok(submitted) => {
//!         let done = tollgate.wait(&app, submitted.task.id, Duration::from_secs(30)).await?;
//!         println!("{:?}", done.and_then(|t| t.output));
//!     }
//!     // Errors are flat: match the case you handle.
//!     Err(EngineError::Admission(rejection)) => println!("retry after {:?}", rejection.retry_after()),
//!     Err(other) => return Err(other.into()),
//! }
//! workers.shutdown(Duration::from_secs(10)).await;
//! # Ok(())
//! # }
//! ```

#![warn(missing_docs)]

mod access;
pub mod config;
pub mod cost;
mod cpu;
mod driver;
mod error;
mod facade;
mod inner;
mod list;
pub mod metrics;
pub mod notify;
mod pipeline_cache;
mod pipelines;
pub mod prelude;
pub mod provider;
mod registry;
mod replay;
pub mod stream;
mod sweeper;
pub mod telemetry;
mod watch;
mod webhooks;
mod worker;

pub use access::CallerView;
pub use config::{ConfigError, EngineConfig};
pub use error::{ConflictField, EngineError};
pub use facade::{
    MAX_BATCH, SourceSpec, Submission, SubmissionOwner, Submitted, TaskWaiter, Tollgate,
    TollgateBuilder,
};
pub use list::{
    MinuteCount, STATS_RECENT_WINDOW, STATS_WINDOW, ScopeCost, ScopeState, TaskStats, UsageReport,
};
pub use notify::{Event, FinishedTask, Notifier};
pub use pipelines::{
    PipelineProgress, PipelineStart, PipelineStep, StartedRun, StepStatus, step_effect_key,
};
pub use provider::{Provider, ProviderAnswer, ProviderCall, ProviderError};
pub use registry::{BudgetPolicies, ModelRegistry, ResolvedModel};
pub use stream::{StreamEvent, StreamSink, TaskEvent, TaskEvents};
pub use telemetry::{TraceSpan, Traces};
pub use webhooks::{WebhookChange, WebhookInput};
pub use worker::{EngineHandle, ShutdownReport};

/// The pure rules crate, for what the [`prelude`] does not name.
pub use tollgate_core as core;
/// The store crate (backends, the `Store` traits), for embedders that open stores
/// themselves and pass them to [`Tollgate::new`].
pub use tollgate_store as store;

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
//! ```no_run
//! use serde_json::json;
//! use std::time::Duration;
//! use tollgate_core::{AppId, EffectKey, ScopeId, TaskKind};
//! use tollgate_engine::{EngineConfig, Submission, Tollgate};
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let tollgate = Tollgate::open("sqlite://tollgate.db", EngineConfig::default()).await?;
//! let workers = tollgate.start().await?;
//! let app = AppId::new("acme")?;
//! let submitted = tollgate
//!     .submit(Submission::application(
//!         app.clone(),
//!         ScopeId::new("customer-42")?,
//!         EffectKey::new("label-email-981")?,
//!         TaskKind::Classify,
//!         json!({"input": "Win a free cruise!", "labels": ["spam", "ham"]}),
//!     ))
//!     .await?;
//! let done = tollgate.wait(&app, submitted.task.id, Duration::from_secs(30)).await?;
//! println!("{:?}", done.and_then(|t| t.output));
//! workers.shutdown(Duration::from_secs(10)).await;
//! # Ok(())
//! # }
//! ```

#![warn(missing_docs)]

mod access;
pub mod config;
mod cpu;
mod driver;
mod error;
mod facade;
mod list;
pub mod metrics;
pub mod notify;
mod pipelines;
pub mod provider;
mod registry;
mod sweeper;
mod worker;

pub use access::CallerView;
pub use config::{ConfigError, EngineConfig};
pub use error::EngineError;
pub use facade::{
    MAX_BATCH, SourceSpec, Submission, SubmissionOwner, Submitted, Tollgate, TollgateBuilder,
};
pub use list::{STATS_WINDOW, ScopeCost, ScopeState, TaskStats};
pub use notify::{Event, Notifier};
pub use pipelines::{
    PipelineRunInfo, PipelineStart, StartedRun, StepInfo, StepStatus, step_effect_key,
};
pub use provider::{Provider, ProviderAnswer, ProviderCall, ProviderError};
pub use registry::{BudgetPolicies, ModelRegistry, ResolvedModel};
pub use worker::{EngineHandle, ShutdownReport};

//! Everything an embedding Rust program touches, so `tollgate-engine` is the one crate it
//! depends on: `use tollgate_engine::prelude::*;`.
//!
//! The engine's own types (the [`Tollgate`] facade, [`Submission`], [`EngineError`], the
//! configuration), and the core and store types that appear in its signatures: ids,
//! owners and subjects, the kinds and their typed requests, tasks, runs, usage, errors.

pub use crate::config::{ConfigError, EngineConfig};
pub use crate::{
    CallerView, ConflictField, EngineError, EngineHandle, Event, MAX_BATCH, ModelRegistry,
    Notifier, PipelineProgress, PipelineStart, PipelineStep, ShutdownReport, SourceSpec,
    StartedRun, StepStatus, Submission, SubmissionOwner, Submitted, Tollgate, TollgateBuilder,
};
pub use tollgate_core::kinds::{
    ClassifyManyRequest, ClassifyRequest, ExtractDataRequest, GenerateTextRequest, Label,
};
pub use tollgate_core::{
    AdmissionRejection, AppId, BudgetName, EffectKey, ErrorCode, InvalidInput, ModelId, NewRun,
    Owner, PipelineName, Run, RunId, RunState, ScopeId, SourceId, SourceRevision, StepKey, Subject,
    Task, TaskId, TaskKind, TaskOwner, TaskRequest, TaskStatus, Usage, Visibility,
};
pub use tollgate_store::{
    RunCancel, RunResult, SweepReport, UnreleasedPage, UnreleasedQuery, WaitOutcome,
};

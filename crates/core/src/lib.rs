//! Tollgate's pure domain: tasks, owners, budgets, the four task kinds with their JSON
//! Schemas and output validation, canonical JSON and hashes, admission arithmetic and
//! stable error codes. No I/O, no async: every rule here is a plain function.

#![warn(missing_docs)]

pub mod admission;
pub mod attempt;
pub mod budget;
pub mod canonical;
pub mod cost;
pub mod dispatch;
pub mod duration;
pub mod error;
pub mod ids;
pub mod json;
pub mod kinds;
pub mod model;
pub mod pipeline;
pub mod route;
pub mod task;
pub mod time;
pub mod trace;
pub mod webhook;

pub use admission::{AdmissionRejection, AdmissionSnapshot, BucketState, decide};
pub use attempt::{Attempt, AttemptOutcome, Charged, MaxAttempts};
pub use budget::{Budget, GlobalShare, ShareUse, decide_global_share};
pub use cost::{CostLimits, CostRejection, Prices, Reservation, TokenBound, TokenRate};
pub use dispatch::{
    DEFAULT_AGEING_STEP, Dispatch, JOIN_CREDIT_TASKS, PASS_SCALE, Priority, QueueShare, Weight,
    allocate_claims, dispatch_key, join_credit, pace_cost_us, stride,
};
pub use duration::{DurationError, DurationSyntax, parse_duration};
pub use error::{ErrorCode, InvalidInput, OutputTooLarge, OutputViolation};
pub use ids::{
    AppId, BudgetName, EffectKey, EngineKeySpace, MAX_ID_CHARS, ModelId, PipelineName,
    PipelineVersion, RunId, ScopeId, SourceId, SourceRevision, StepKey, TaskId, WorkerId,
    check_identifier, identifier_pattern,
};
pub use kinds::{
    EmbedInput, EmbedItem, EmbedRequest, MAX_EMBED_DIMENSIONS, MAX_EMBED_INPUT_BYTES,
    MAX_EMBED_INPUTS, TaskKind, TaskRequest, check_output_fits, check_output_size, embed_item_key,
    validate_output,
};
pub use model::{ConfigHash, ModelRef};
pub use route::{Deployment, Route, Strategy};
pub use task::*;
pub use time::{Clock, ManualClock, SystemClock, Timestamp};
pub use trace::{TraceParent, TraceParentError};

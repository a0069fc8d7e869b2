//! Dialect-free code both backends call (see the crate docs, "One rule, one place"):
//! row decoding ([`rows`]), what a terminal move does ([`terminal`]) and the admission
//! facts a backend reads and hands to core's decision ([`admission`]), and the
//! run transactions ([`runs`]), the application's side of tasks ([`tasks`]), pipelines
//! ([`pipelines`]), cost settlement and usage ([`cost`]),
//! the listings ([`list`]) and the plan of a fair claim ([`dispatch`], docs/conformance.md#fair-share); the
//! one way both backends bind and run a statement ([`sql`]); and whole SQL texts with
//! named parameters, bound by name from one struct into such a statement ([`named`]),
//! with the texts both dialects share in `sql/`.

pub(crate) mod admission;
pub(crate) mod attempts;
pub(crate) mod completion;
pub(crate) mod cost;
pub(crate) mod dispatch;
pub(crate) mod embeddings;
pub(crate) mod group;
pub(crate) mod lifecycle;
pub(crate) mod list;
pub(crate) mod maintenance;
pub(crate) mod named;
pub(crate) mod pipelines;
pub(crate) mod rows;
pub(crate) mod runs;
pub(crate) mod sql;
pub(crate) mod stream_log;
pub(crate) mod tasks;
pub(crate) mod terminal;
pub(crate) mod webhooks;

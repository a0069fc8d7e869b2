//! docs/conformance.md#admission: admission control of scoped tasks.
//!
//! One test per rule, grouped by what the rule counts; every test is re-exported here, so
//! its name is `admission::<test>` whatever file holds it.

mod limits;
mod steps;
mod window;

pub use limits::*;
pub use steps::*;
pub use window::*;

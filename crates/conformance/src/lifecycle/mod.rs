//! docs/conformance.md#heartbeat: claim, heartbeat, complete, fail, cancel; docs/conformance.md#sweep-recovery: recovery listing.
//!
//! One test per rule, grouped by operation; every test is
//! re-exported here, so its name is `lifecycle::<test>` whatever file holds it.

mod claim;
mod complete;
mod ending;
mod recovery;

pub use claim::*;
pub use complete::*;
pub use ending::*;
pub use recovery::*;

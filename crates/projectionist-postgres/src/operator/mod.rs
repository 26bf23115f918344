//! The operator's side beside a live run: resuming parked aggregates (retry, discard, skip),
//! rebuilding and repairing, and what depends on a projection's tables (views, grants).

pub(crate) mod dependents;
pub mod rebuild;
pub(crate) mod resolve;

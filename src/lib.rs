#![doc = include_str!("../README.md")]
//!
//! ## This crate
//!
//! The facade: the core types at the top level, the PostgreSQL side as [`postgres`], the
//! Kafka runtime as [`kafka`], the schema registry's client as [`registry`]; with cargo features, the command line of a projection binary
//! as `cli` (feature `cli`) and the test kit as `testing` (feature `testing`).

#[cfg(feature = "cli")]
pub use projectionist_cli as cli;
pub use projectionist_core::*;
pub use projectionist_kafka as kafka;
pub use projectionist_postgres as postgres;
pub use projectionist_registry as registry;
#[cfg(feature = "testing")]
pub use projectionist_testing as testing;

/// The Rust examples of docs/projections.md, compiled as doc tests so that the page stays
/// true (not part of the API).
#[cfg(doctest)]
#[doc = include_str!("../docs/projections.md")]
pub struct ProjectionsGuide;

/// The Rust examples of docs/running.md, compiled as doc tests (not part of the API).
#[cfg(doctest)]
#[doc = include_str!("../docs/running.md")]
pub struct RunningGuide;

#![doc = include_str!("../README.md")]
//!
//! ## This crate
//!
//! The facade: the core types at the top level, the PostgreSQL side as [`postgres`], the
//! Kafka runtime as [`kafka`].

pub use projectionist_core::*;
pub use projectionist_kafka as kafka;
pub use projectionist_postgres as postgres;
pub use projectionist_postgres::gate;

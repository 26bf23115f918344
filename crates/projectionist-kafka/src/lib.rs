#![doc = include_str!("../README.md")]

mod batcher;
pub mod client;
mod config;
mod context;
mod dead_letters;
mod engine;
mod error;
mod headers;
pub mod metrics;
mod outage;
mod partition;
pub mod rebuild;
pub mod repair;
mod retry;
mod runner;
mod scope;
mod stats;
pub mod topics;
mod tp;
mod trace;

pub use client::{ConnectFailure, KafkaClientConfig};
pub use config::{redact_userinfo, EngineConfig, Exclusive, ProjectionSettings};
pub use engine::{Engine, Readiness, ReadyState, Registration, RunReport};
pub use error::{Error, Result};
pub use retry::{Retry, RetryPolicy, Retrying};
pub use stats::{Accounting, Stats};

#![doc = include_str!("../README.md")]

pub mod checkpoint;
mod config;
mod context;
mod engine;
mod error;
mod runner;
pub mod topics;

pub use config::{redact_userinfo, EngineConfig};
pub use engine::{Engine, Registration, RunReport};
pub use error::{Error, Result};
pub use runner::Stats;

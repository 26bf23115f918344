#![doc = include_str!("../README.md")]

mod avro;
mod client;
mod config;
mod error;
mod protobuf;
mod registry;
mod schemas;
pub mod wire;

pub use config::RegistryConfig;
pub use error::{Error, Result};
pub use registry::{Reader, ReaderSchema, Registry};

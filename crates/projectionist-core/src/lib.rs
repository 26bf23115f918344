#![doc = include_str!("../README.md")]

mod envelope;
mod error;
mod event_types;
mod outcome;
mod projection;

pub use async_trait::async_trait;
pub use envelope::{Decoded, Envelope, RawEnvelope};
pub use error::{ApplyError, DecodeError};
pub use event_types::event_types;
pub use outcome::{Outcome, OutcomeCounts};
pub use projection::{validate_projection_name, Projection};

#![doc = include_str!("../README.md")]

mod envelope;
mod error;
mod event_types;
pub mod fold;
pub mod format;
mod outcome;
pub mod plan;
mod projection;
mod table;
#[cfg(test)]
mod test_types;
pub mod upcast;
mod write;

pub use async_trait::async_trait;
pub use envelope::{data_tree, Decoded, Envelope, EventDecoder, EventId, LazyEnvelope, RawEnvelope};
pub use error::{ApplyError, DecodeError};
pub use event_types::event_types;
pub use outcome::{Outcome, OutcomeCounts};
pub use projection::{validate_projection_name, OnGap, OnPoison, OnUnknownType, Projection};
pub use table::{check_key, quote, Gate, Table, MAX_KEY_BYTES};
pub use upcast::Upcaster;
pub use write::{Change, Op, Target, Write, Writes};

//! What a wait answers besides "applied": where a projection stands ([`Position`]), and
//! what became of an event kept out of the read model ([`Fate`]). Leaf types: the crate's
//! errors carry them.

use serde::Serialize;

/// Where a projection stands, as the waits report it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Position {
    /// On a partition: the next offset it reads (`None`: nothing checkpointed yet).
    Offset {
        /// The partition's next offset to read; every offset below it is applied.
        next_offset: Option<i64>,
    },
    /// An aggregate: the version its rows stand at (`None`: no row of it yet).
    Version {
        /// The highest version of the aggregate's rows in the projection's gated tables.
        version: Option<i64>,
    },
}

impl std::fmt::Display for Position {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Position::Offset { next_offset: Some(next) } => {
                write!(f, "applied up to offset {} (next {next})", next - 1)
            }
            Position::Offset { next_offset: None } => write!(f, "nothing applied on that partition yet"),
            Position::Version { version: Some(v) } => write!(f, "the aggregate stands at version {v}"),
            Position::Version { version: None } => write!(f, "no row of the aggregate yet"),
        }
    }
}

/// An event past the checkpoint that is not in the read model, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "fate", rename_all = "kebab-case")]
pub enum Fate {
    /// Held behind its parked aggregate: it applies once the version the aggregate waits
    /// for arrives (or its dead letter is resolved).
    Parked {
        /// The aggregate's type.
        aggregate_type: String,
        /// The aggregate's id.
        aggregate_id: String,
        /// The event's version.
        version: i64,
        /// Why the aggregate is parked (`parked` lists it).
        reason: String,
    },
    /// A dead letter, open: it applies only if an operator retries it.
    DeadLettered {
        /// The dead letter's id (`dead-letters show`).
        id: i64,
        /// Why it could not be applied.
        error: String,
    },
    /// A dead letter an operator discarded: its version was skipped on purpose.
    Discarded {
        /// The dead letter's id.
        id: i64,
    },
}

impl std::fmt::Display for Fate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fate::Parked { aggregate_type, aggregate_id, version, reason } => {
                write!(f, "held: {aggregate_type}/{aggregate_id} v{version} is parked ({reason})")
            }
            Fate::DeadLettered { id, error } => write!(f, "dead-lettered as dead letter {id}: {error}"),
            Fate::Discarded { id } => write!(f, "dead-lettered, then discarded (dead letter {id})"),
        }
    }
}

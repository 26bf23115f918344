//! The trait a projection author implements.

use async_trait::async_trait;
use serde::de::DeserializeOwned;

use crate::{ApplyError, Envelope, Outcome, Table, Upcaster, Writes};

/// A read model built from one stream of versioned events.
///
/// The fast path is [`project`](Projection::project): say what an event writes, as values
/// ([`Writes`]), to tables declared once ([`tables`](Projection::tables)). The engine reads
/// the stored versions of a whole batch at once, classifies every event exactly as a
/// per-event gate would (applied, duplicate, stale, gap, ignored), coalesces each row's
/// chain of events into one write and applies the batch with a few set-based statements,
/// in one transaction together with the checkpoint. No transaction, no `async`, no SQL.
///
/// [`apply`](Projection::apply) is the escape hatch for custom SQL: return
/// [`Writes::custom`] from `project` for the events it handles. It runs one event at a
/// time in the batch's transaction (`Tx`: `sqlx::PgConnection` with
/// `projectionist-postgres`), so it is the slow path. The engine gates it like any event
/// (the aggregate's declared gates, and with a [custom table](Table::custom) its
/// aggregate version) and calls it only for an event that applies.
///
/// ```
/// use projectionist_core::{Envelope, Projection, Table, Writes};
/// use serde::Deserialize;
///
/// #[derive(Deserialize)]
/// #[serde(tag = "type", content = "data")]
/// enum CounterEvent {
///     Incremented { by: i64 },
/// }
///
/// const COUNTERS: Table =
///     Table::transition("counters", "counter_id").aggregate_type("counter").columns(&[("count", "bigint NOT NULL")]);
///
/// struct Counters;
///
/// impl Projection<()> for Counters {
///     type Event = CounterEvent;
///
///     fn name(&self) -> &str {
///         "counters"
///     }
///
///     fn tables(&self) -> &[Table] {
///         &[COUNTERS]
///     }
///
///     fn project(&self, event: &Envelope<CounterEvent>) -> Writes {
///         let CounterEvent::Incremented { by } = event.event;
///         COUNTERS.write(event).add("count", by).into()
///     }
/// }
/// ```
#[async_trait]
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a projection over `{Tx}`",
    note = "implement `Projection<sqlx::PgConnection>` for `{Self}` to project into PostgreSQL"
)]
pub trait Projection<Tx: ?Sized + Send>: Send + Sync + 'static {
    /// The projection's events: a serde enum tagged by the envelope's `type`, e.g.
    /// `#[serde(tag = "type", content = "data")]`. Event types with no variant are
    /// reported as [`Outcome::Ignored`] and still move the aggregate's version gate, or
    /// halt, as [`on_unknown_type`](Projection::on_unknown_type) says.
    type Event: DeserializeOwned + Send + Sync + 'static;

    /// What an event whose type [`Event`](Projection::Event) has no variant for does. The
    /// default, [`OnUnknownType::Warn`], ignores it with a warning the first time a run
    /// meets each such type: a name spelled differently by the producer (`stock_added`
    /// for `StockAdded`) would otherwise drop events unseen.
    fn on_unknown_type(&self) -> OnUnknownType {
        OnUnknownType::Warn
    }

    /// Upcasters of old event shapes, run on each event's JSON before it is decoded into
    /// [`Event`](Projection::Event) (see [`Upcaster`]). None by default.
    fn upcasters(&self) -> &[Upcaster] {
        &[]
    }

    /// Stable name: keys checkpoints, aggregate versions, the consumer group and metric labels.
    /// Changing it makes the engine treat the projection as new.
    fn name(&self) -> &str;

    /// The tables this projection owns, each declared once: `migrate` creates them, a reset
    /// empties them, the test kit compares them, and their gates guard every write.
    fn tables(&self) -> &[Table] {
        &[]
    }

    /// Extra idempotent DDL run by `migrate` after the tables are created (indexes, views).
    fn schema(&self) -> &[&str] {
        &[]
    }

    /// What `event` writes. The default hands every event to [`apply`](Projection::apply).
    fn project(&self, event: &Envelope<Self::Event>) -> Writes {
        let _ = event;
        Writes::custom()
    }

    /// The slow path, for events [`project`](Projection::project) marks
    /// [`Writes::custom`]: applies one event with custom SQL in the batch's transaction.
    /// Called only for an event the engine's gates let through (never for a duplicate, a
    /// stale re-send or a gap); return [`Outcome::Applied`], or another outcome your own
    /// rules decide. Return an error only for failures (database errors are retried by the
    /// engine when retryable).
    async fn apply(&self, tx: &mut Tx, event: &Envelope<Self::Event>) -> Result<Outcome, ApplyError> {
        let _ = (tx, event);
        Err(ApplyError::msg(format!(
            "projection {} returned Writes::custom() but does not implement apply",
            self.name()
        )))
    }
}

/// What the engine does with an event whose type the projection has no variant for. Every
/// such event is counted by type in `projectionist_events_ignored_total`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum OnUnknownType {
    /// Ignore it silently: the projection leaves out types it knows of on purpose. The
    /// event still moves its aggregate's version gate ([`Outcome::Ignored`]).
    Ignore,
    /// Ignore it, and log a warning the first time a run meets each such type, naming the
    /// type and the projection's own.
    #[default]
    Warn,
    /// Halt the partition at the event, as for an event that does not decode: nothing at
    /// or after it is applied until the projection handles the type or the event is gone.
    Halt,
}

/// What the engine does with an event whose predecessor version was never applied (a gap):
/// set per run (`on_gap` in the settings, `--on-gap`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnGap {
    /// Park the aggregate: the event and its aggregate's later events are held, exactly as
    /// read, in the engine's table `projectionist_held` ([`Outcome::Parked`]), while every
    /// other aggregate flows and the checkpoint moves on; when the missing version arrives
    /// (a re-send, a replay) it is applied and the held events after it, in version order,
    /// in the same transaction. The default.
    #[default]
    Park,
    /// Halt the partition at the event: nothing at or after it is applied until the
    /// missing version is published and the projector restarted.
    Halt,
}

impl std::str::FromStr for OnGap {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "park" => Ok(Self::Park),
            "halt" => Ok(Self::Halt),
            other => Err(format!("on_gap is park or halt, not {other:?}")),
        }
    }
}

/// What the engine does with an event that can never apply as it stands (poison): a
/// message that is not an envelope (malformed JSON, a missing field, a tombstone), a key that
/// contradicts its `aggregate_id`, data that does not decode, a value the table refuses, an
/// `apply` still failing after the retries. Set per run (`on_poison`, `--on-poison`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OnPoison {
    /// Keep it as a dead letter in the engine's table `projectionist_dead_letters` (the
    /// message's exact bytes and headers, where it was read, the full error), park its
    /// aggregate behind it (the aggregate's later events are held, in order), and let
    /// everything else flow. A message with no usable aggregate (not an envelope, or a key
    /// that contradicts it) is dead-lettered alone. The default.
    #[default]
    DeadLetter,
    /// Halt the partition at the event: nothing at or after it is applied until it is
    /// fixed.
    Halt,
}

impl std::str::FromStr for OnPoison {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "dead-letter" => Ok(Self::DeadLetter),
            "halt" => Ok(Self::Halt),
            other => Err(format!("on_poison is dead-letter or halt, not {other:?}")),
        }
    }
}

/// Checks a projection name: 1–48 characters of `a-z`, `0-9`, `_` and `-`, starting with a
/// letter, so it is safe in consumer group ids, metric labels and table rows.
pub fn validate_projection_name(name: &str) -> Result<(), String> {
    let ok_len = !name.is_empty() && name.len() <= 48;
    let ok_first = name.chars().next().is_some_and(|c| c.is_ascii_lowercase());
    let ok_chars = name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-');
    if ok_len && ok_first && ok_chars {
        Ok(())
    } else {
        Err(format!(
            "projection name {name:?} is invalid: use 1-48 characters of a-z, 0-9, '_' and '-', starting with a letter"
        ))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn validates_projection_names() {
        assert!(super::validate_projection_name("bank_accounts").is_ok());
        assert!(super::validate_projection_name("order-status2").is_ok());
        for bad in ["", "Bank", "1x", "a b", "x;drop", &"a".repeat(49)] {
            assert!(super::validate_projection_name(bad).is_err(), "{bad}");
        }
    }
}

//! The trait a projection author implements.

use async_trait::async_trait;
use serde::de::DeserializeOwned;

use crate::{ApplyError, Envelope, Outcome};

/// A read model built from one stream of versioned events.
///
/// `Tx` is the transaction the engine hands in: with `projectionist-postgres` it is
/// `sqlx::PgConnection` (an open transaction). The engine opens it, calls
/// [`apply_batch`](Projection::apply_batch), records its checkpoint in the same
/// transaction and commits — so one batch is all-or-nothing.
///
/// Every write must be gated by aggregate ID + version (use the helpers in
/// `projectionist_postgres::gate`), so redeliveries and replays are no-ops.
///
/// ```
/// use async_trait::async_trait;
/// use projectionist_core::{ApplyError, Envelope, Outcome, Projection};
/// use serde::Deserialize;
/// use std::collections::HashMap;
///
/// #[derive(Deserialize)]
/// #[serde(tag = "type", content = "data")]
/// enum CounterEvent {
///     Incremented { by: i64 },
/// }
///
/// /// Counts per aggregate, in a map standing in for a database transaction.
/// struct Counter;
///
/// #[async_trait]
/// impl Projection<HashMap<String, (i64, i64)>> for Counter {
///     type Event = CounterEvent;
///
///     fn name(&self) -> &str {
///         "counter"
///     }
///
///     async fn apply(
///         &self,
///         tx: &mut HashMap<String, (i64, i64)>,
///         env: &Envelope<CounterEvent>,
///     ) -> Result<Outcome, ApplyError> {
///         let CounterEvent::Incremented { by } = env.event;
///         let (count, version) = tx.entry(env.aggregate_id.clone()).or_default();
///         if *version != env.version - 1 {
///             return Ok(Outcome::of_failed_transition(Some(*version), env.version).unwrap());
///         }
///         *count += by;
///         *version = env.version;
///         Ok(Outcome::Applied)
///     }
/// }
/// ```
#[async_trait]
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a projection over `{Tx}`",
    note = "implement `Projection<sqlx::PgConnection>` for `{Self}` with #[async_trait] to project into PostgreSQL"
)]
pub trait Projection<Tx: ?Sized + Send>: Send + Sync + 'static {
    /// The projection's events: a serde enum tagged by the envelope's `type`, e.g.
    /// `#[serde(tag = "type", content = "data")]`. Event types with no variant are
    /// reported as [`Outcome::Ignored`] without calling the projection.
    type Event: DeserializeOwned + Send + Sync + 'static;

    /// Stable name: keys checkpoints, watermarks, the consumer group and metric labels.
    /// Changing it makes the engine treat the projection as new.
    fn name(&self) -> &str;

    /// Idempotent DDL creating the projection's tables (`CREATE TABLE IF NOT EXISTS …`),
    /// run in order by `migrate`.
    fn schema(&self) -> &[&str] {
        &[]
    }

    /// The tables this projection owns: dumped by the test kit, truncated on reset.
    fn tables(&self) -> &[&str] {
        &[]
    }

    /// Applies one event. Return the gate's outcome; return an error only for failures
    /// (database errors are retried by the engine when retryable).
    async fn apply(&self, tx: &mut Tx, event: &Envelope<Self::Event>) -> Result<Outcome, ApplyError>;

    /// Applies a batch of events in offset order inside one transaction, one outcome per
    /// event. Override for set-based speed; the result must equal applying one by one.
    async fn apply_batch(&self, tx: &mut Tx, events: &[Envelope<Self::Event>]) -> Result<Vec<Outcome>, ApplyError> {
        let mut outcomes = Vec::with_capacity(events.len());
        for event in events {
            outcomes.push(self.apply(tx, event).await?);
        }
        Ok(outcomes)
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

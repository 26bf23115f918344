//! Applying a batch of raw envelopes in a transaction of its own, outside the engine: for
//! tests and tools.

use projectionist_core::{OnGap, OnPoison, Outcome, RawEnvelope};
use sqlx::PgPool;

use crate::error::Error;
use crate::error::Result;
use crate::projection::PgProjection;
use crate::source::{Source, SourceMessage};
use crate::writing::known::KnownVersions;
use crate::writing::writer::{self, Mode};

/// Applies `batch` in one transaction of its own and commits it (no checkpoint: the Kafka
/// engine adds its own in the same transaction): set-based, or per event where the batch
/// needs it. Used by tests and tools: unlike the engine, which halts a partition at a gap,
/// it goes on past one (the gap's event is not applied), so every event has an outcome.
pub async fn apply_batch(pool: &PgPool, projection: &dyn PgProjection, batch: &[RawEnvelope]) -> Result<Vec<Outcome>> {
    apply_batch_in(pool, projection, batch, Mode::Batch, Policy::HALT).await
}

/// What a batch does with an event that cannot be applied: a gap, a poison event.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Policy {
    /// A gap parks its aggregate, or is [`Outcome::Gap`].
    pub on_gap: OnGap,
    /// A poison event is dead-lettered (its aggregate parked behind it), or an error.
    pub on_poison: OnPoison,
}

impl Policy {
    /// Gaps are [`Outcome::Gap`], poison events errors.
    pub const HALT: Self = Self { on_gap: OnGap::Halt, on_poison: OnPoison::Halt };
}

/// As [`apply_batch`], starting in the given mode, with the given policy: with
/// [`OnGap::Park`] a gap parks its aggregate as the engine does, and with
/// [`OnPoison::DeadLetter`] a poison event is dead-lettered (the held events and dead
/// letters stored as their envelopes' JSON, with no topic and no offset); [`Outcome::Parked`]
/// events can be applied by a later call, when the missing version comes.
pub async fn apply_batch_in(
    pool: &PgPool,
    projection: &dyn PgProjection,
    batch: &[RawEnvelope],
    mode: Mode,
    policy: Policy,
) -> Result<Vec<Outcome>> {
    in_transaction(pool, projection, batch, (mode, policy), None).await
}

/// As [`apply_batch_in`], remembering in `known` the versions each batch commits, as the
/// engine's partitions do, so that the next batch reads only those it does not know (see
/// [`KnownVersions`]): for tests of that path.
pub async fn apply_batch_knowing(
    pool: &PgPool,
    projection: &dyn PgProjection,
    batch: &[RawEnvelope],
    (mode, policy): (Mode, Policy),
    known: &KnownVersions,
) -> Result<Vec<Outcome>> {
    known.begin();
    let applied = in_transaction(pool, projection, batch, (mode, policy), Some(known)).await;
    match &applied {
        Ok(_) => known.committed(),
        Err(_) => known.forget(),
    }
    applied
}

async fn in_transaction(
    pool: &PgPool,
    projection: &dyn PgProjection,
    batch: &[RawEnvelope],
    (mode, policy): (Mode, Policy),
    known: Option<&KnownVersions>,
) -> Result<Vec<Outcome>> {
    let halts = |e: &Error| e.halts(policy.on_poison);
    let mut tx = pool.begin().await?;
    let mut outcomes = Vec::with_capacity(batch.len());
    while outcomes.len() < batch.len() {
        let start = outcomes.len();
        let rest = &batch[start..];
        let mut prepared = projection.prepare(rest.to_vec());
        if let Some((index, e)) = prepared.failures().find(|(_, e)| halts(e)) {
            return Err(e.clone_of_batch().at(index).shifted(start));
        }
        let messages = rest.iter().map(|raw| SourceMessage { payload: raw.to_json(), ..SourceMessage::default() });
        prepared.set_source(Source {
            topic: String::new(),
            partition: 0,
            messages: messages.collect(),
            ..Source::default()
        });
        loop {
            let mut attempt = sqlx::Connection::begin(&mut *tx).await?;
            match writer::write_knowing(&mut attempt, projection, &prepared, mode, policy.on_gap, known).await {
                Ok(written) => {
                    attempt.commit().await?;
                    outcomes.extend(written.outcomes);
                    break;
                }
                Err(e) => {
                    attempt.rollback().await?;
                    // What the attempt wrote is gone again.
                    if let Some(known) = known {
                        known.off();
                    }
                    match e.event_index() {
                        // An event the batch cannot apply: dead-lettered, the rest written again.
                        Some(index) if !halts(&e) => prepared.poison(index, e).map_err(|e| e.shifted(start))?,
                        _ => return Err(e.shifted(start)),
                    }
                }
            }
        }
    }
    tx.commit().await?;
    Ok(outcomes)
}

//! Repairing a few aggregates beside a live run (`rebuild --aggregate TYPE ID`): their rows
//! derived again from their events alone, read from the partitions their keys can be on (see
//! [`Partitions`]), in a shadow of their own, then put in place of the live rows in one
//! transaction with the live writers held back (see [`projectionist_postgres::rebuild::repair_held`]).
//!
//! The repaired rows carry the version they were derived to: the events a live run applies
//! afterwards that are not newer are duplicates to them, and the newer ones apply once.

mod partitioners;

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};

use projectionist_postgres::rebuild::{self, Repair};
pub use projectionist_postgres::rebuild::{unrepairable, Repaired};
use projectionist_postgres::{PgPool, SharedProjection};
use tracing::Instrument;

use crate::rebuild::{noted, problem, shadow_config, shadow_pool, Build, HELD_LAG_MAX, HOLD_FROM, MAX_CATCH_UPS};
use crate::scope::{Aggregate, Scope};
use crate::tp::Tp;
use crate::{EngineConfig, Exclusive, KafkaClientConfig, Result};

/// How a repair ended.
#[derive(Debug)]
pub enum Repairing {
    /// The aggregates' rows are in place.
    Repaired {
        /// What was put in place, aggregate by aggregate.
        aggregates: Vec<Repaired>,
        /// The partitions read (topic, partition).
        partitions: Vec<(String, i32)>,
    },
    /// Stopped by the shutdown signal before its rows were put in place: nothing changed.
    Stopped,
}

/// Where a repair reads its aggregates' events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Partitions {
    /// The partitions their keys (their ids) can be on under the common producers' default
    /// partitioners:
    ///
    /// | producer | default partitioner of a keyed record |
    /// |---|---|
    /// | Java client, Kafka Streams, Kafka Connect, franz-go, kafka-python | murmur2 of the key |
    /// | librdkafka (confluent-kafka-python / -go / .NET, rust-rdkafka) | CRC-32 of the key |
    /// | librdkafka with `partitioner=fnv1a`, Sarama | FNV-1a of the key |
    OfTheirKeys,
    /// Every partition: the topic was repartitioned, or is keyed otherwise.
    All,
}

/// Repairs `aggregates` (type and id) of `projection` (consuming `topics`): their rows
/// derived from their events alone in a shadow, then put in place of the live ones in one
/// transaction once the shadow has read the partitions as far as the live run (see the
/// module). Holds the projection's rebuild lock throughout: a rebuild meanwhile is refused.
/// Refuses a projection with fan-in or custom tables (see [`unrepairable`]).
pub async fn repair(
    pool: &PgPool,
    config: EngineConfig,
    projection: SharedProjection,
    topics: Vec<String>,
    aggregates: Vec<Aggregate>,
    read: Partitions,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<Repairing> {
    let name = projection.name().to_owned();
    let span = tracing::info_span!("repair", otel.name = %format_args!("repair {name}"), projection = %name);
    async move {
        if aggregates.is_empty() {
            return Err(problem(&name, "no aggregate named to repair".into()));
        }
        let lock = rebuild::lock(pool, &name).await?;
        let partitions = partitions_to_read(config.client.clone(), topics.clone(), &aggregates, read).await?;
        rebuild::prepare_repair(pool, projection.as_ref()).await?;
        let said = partitions.iter().map(|(t, p)| format!("{t}/{p}")).collect::<Vec<_>>().join(", ");
        tracing::info!(projection = %name, aggregates = ?aggregates, partitions = %said, "Repair starting.");
        let repaired = rounds(pool, config, projection, topics, aggregates, partitions, shutdown).await;
        if !matches!(repaired, Ok(Repairing::Repaired { .. })) {
            // Nothing is put in place: the shadow is of no use to anything.
            let _ = rebuild::abandon(pool, &name).await;
        }
        lock.release().await?;
        repaired
    }
    .instrument(span)
    .await
}

/// The partitions of `topics` a repair of `aggregates` reads (see [`Partitions`]).
async fn partitions_to_read(
    client: KafkaClientConfig,
    topics: Vec<String>,
    aggregates: &[Aggregate],
    read: Partitions,
) -> Result<Vec<(String, i32)>> {
    let keys: Vec<Vec<u8>> = aggregates.iter().map(|(_, id)| id.as_bytes().to_vec()).collect();
    let listed = tokio::task::spawn_blocking(move || {
        let mut out = Vec::new();
        for topic in topics {
            let partitions = crate::topics::partitions(client.clone(), &topic)?;
            let count = partitions.len() as i32;
            let candidates: BTreeSet<i32> = keys.iter().flat_map(|k| partitioners::candidates(k, count)).collect();
            let read_it = |p: &i32| read == Partitions::All || candidates.contains(p);
            out.extend(partitions.into_iter().filter(read_it).map(|p| (topic.clone(), p)));
        }
        Ok(out)
    });
    listed.await.map_err(|e| crate::Error::Task(e.to_string()))?
}

/// The repair's rounds: the shadow read up to the head, then the rows put in place, or read
/// on while the live run is ahead (from round [`HOLD_FROM`] on, a little behind, with the live
/// writers held back for the next round).
async fn rounds(
    pool: &PgPool,
    config: EngineConfig,
    projection: SharedProjection,
    topics: Vec<String>,
    aggregates: Vec<Aggregate>,
    partitions: Vec<(String, i32)>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<Repairing> {
    let name = projection.name().to_owned();
    let scope = Scope {
        partitions: Some(partitions.iter().map(|(t, p)| Tp::new(t.as_str(), *p)).collect()),
        aggregates: Some(aggregates.iter().cloned().collect()),
    };
    let folded = AtomicU64::new(0);
    let (shadow_pool, config) = (shadow_pool(pool, &name).await?, shadow_config(config, projection.as_ref()));
    let build = Build { pool, shadow_pool, config, projection, topics, folded: &folded, resumed: false, scope };
    let (stopped, shutdown) = noted(shutdown);
    tokio::pin!(shutdown);
    let mut exclusive = Exclusive { sole_writer: true, fold: true, sole_reader: true };
    let mut held = None;
    for round in 1..=MAX_CATCH_UPS {
        let span = tracing::info_span!("round", otel.name = "repair round", round);
        let report = build.round(exclusive, shutdown.as_mut()).instrument(span).await?;
        if let Some(halt) = report.halts().first() {
            if exclusive.fold {
                exclusive.fold = false;
                continue;
            }
            return Err(problem(&name, format!("it halted, the live tables untouched: {halt}")));
        }
        if stopped.load(Ordering::SeqCst) {
            return Ok(Repairing::Stopped);
        }
        // What an operator discarded on the live side is discarded in the shadow too, so
        // that the aggregate goes past it there as it did live.
        rebuild::carry_discards(pool, &build.shadow_pool, build.projection.as_ref()).await?;
        let holding = match held.take() {
            Some(held) => held,
            None => rebuild::hold(pool, &name).await?,
        };
        match rebuild::repair_held(holding, build.projection.as_ref(), &partitions, &aggregates).await? {
            Repair::Done(repaired) => {
                build.shadow_pool.close().await;
                tracing::info!(projection = %name, repaired = ?repaired, "Repaired.");
                return Ok(Repairing::Repaired { aggregates: repaired, partitions });
            }
            Repair::Behind(behind) => {
                let lag: i64 = behind.iter().map(|(_, _, shadow, live)| live - shadow.unwrap_or(0)).sum();
                tracing::info!(projection = %name, round, lag, "The live run is ahead; reading on.");
                if round >= HOLD_FROM && lag <= HELD_LAG_MAX {
                    held = Some(rebuild::hold(pool, &name).await?);
                }
            }
        }
    }
    let again = format!("it did not catch up with the live run in {MAX_CATCH_UPS} rounds; repair again");
    Err(problem(&name, again))
}

//! One assigned partition's task: it reads the partition's own queue, cuts batches (see
//! [`crate::batcher`]), applies each in one PostgreSQL transaction together with its
//! checkpoint, commits the Kafka offset afterwards, waits out PostgreSQL outages (see
//! [`crate::outage`]), retries other transient failures a bounded number of times and
//! halts the partition at what retrying cannot fix. Partitions run side by side, each with
//! its own task.
//!
//! - `mod.rs` (here): the partition's handles and settings;
//! - [`task`]: the task's loop, its state, one method per thing it waits for;
//! - [`apply`]: one batch, decoded and projected once, put into the partition's sink;
//! - [`sink`]: where a batch goes: written with its checkpoint at once, or folded in memory
//!   and written once due (a rebuild's bulk load, [`fold`]);
//! - [`progress`]: the checkpoint stored, as others see it, Kafka commits, markers, caught-up;
//! - [`halt`]: where and why a partition stopped, reported in one place;
//! - [`heal`]: a halt whose cause can go away, retried;
//! - [`decode`]: messages and their envelopes.

mod apply;
mod decode;
mod fold;
#[cfg(test)]
mod fuzz;
mod halt;
mod heal;
mod progress;
mod schemas;
pub(crate) mod shared;
mod sink;
mod task;

use std::sync::Arc;
use std::time::{Duration, Instant};

use projectionist_core::{OnGap, OnPoison};
use projectionist_postgres::{PgPool, SharedProjection};
use rdkafka::consumer::StreamConsumer;
use tokio::task::JoinHandle;

use crate::batcher::{Batcher, Limits};
use crate::context::EngineContext;
use crate::retry::RetryPolicy;
use crate::stats::{Stats, Tally};
use crate::tp::Tp;
use apply::Applied;
use decode::At;
pub(crate) use decode::Msg;
pub(crate) use halt::{forget, pause, report, Halt, HaltKind};
use heal::Healing;
use progress::MarkerRetry;
pub(crate) use shared::Progress;
pub(crate) use sink::Sink;

/// How long a revoked partition waits for its batch in flight before abandoning it (its
/// transaction rolls back; the next owner reads it again from the checkpoint), so that a
/// statement stuck on a lock cannot hold up the group's rebalance.
const REVOKE_GRACE: Duration = Duration::from_secs(15);

/// How long a seek to a moved checkpoint may take (see `Task::read_on_from`).
const SEEK_TIMEOUT: Duration = Duration::from_secs(10);

/// What the runner asks of a partition task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Order {
    /// Keep going.
    Run,
    /// The partition was revoked: finish the batch in flight (within [`REVOKE_GRACE`]),
    /// drop the rest (it is read again from the checkpoint by the next owner).
    Revoke,
    /// The engine stops: finish the batch in flight, apply what is buffered, then end.
    Shutdown,
}

/// How a partition task begins.
#[derive(Debug)]
pub(crate) enum Begin {
    /// Reading from its start offset.
    Run,
    /// Halted at once (its checkpoint could not be read): the halt is reported.
    Halt(Halt),
    /// Already halted earlier in this process: it stays paused, nothing is reported again.
    Halted,
}

/// What the task needs besides its queue: what it works with (handles shared with the
/// runner and the other partitions), how it works ([`Settings`]) and where its batches go
/// ([`Sink`]).
pub(crate) struct Partition {
    pub tp: Tp,
    pub projection: SharedProjection,
    pub pool: PgPool,
    pub consumer: Arc<StreamConsumer<EngineContext>>,
    pub stats: Arc<Stats>,
    /// What became of the messages it read (shared by its assignments in this process).
    pub tally: Arc<Tally>,
    pub dead_letter_topic: Option<Arc<crate::dead_letters::DeadLetterTopic>>,
    pub checked: Arc<Checked>,
    /// Where its batches go: written at once, or folded (a rebuild's bulk load).
    pub sink: Sink,
    pub progress: Arc<Progress>,
    /// Its batches' bounds.
    pub limits: Limits,
    pub settings: Settings,
    /// How its topic's messages carry the envelope, and the registry's schemas.
    pub reader: projectionist_core::format::Reader,
}

/// How a projection's partitions work: the same for each of them.
#[derive(Clone)]
pub(crate) struct Settings {
    pub retry: RetryPolicy,
    pub exit_when_caught_up: bool,
    /// The longest delay between two tries of a halt that may heal; `None`: halts stay.
    pub heal: Option<Duration>,
    pub on_gap: OnGap,
    pub on_poison: OnPoison,
    /// No one else writes the projection's tables (a rebuild's shadow).
    pub sole_writer: bool,
    pub max_event_bytes: usize,
    pub bounds: projectionist_postgres::park::Bounds,
    /// The consumer group (named on the batch spans).
    pub group: Arc<str>,
    /// The aggregates whose events are applied (see [`crate::scope::Scope`]).
    pub scope: Arc<crate::scope::Scope>,
}

/// What PostgreSQL checks of the projection's tables beyond their declarations (CHECK
/// constraints, domains, unique indexes, foreign keys: `Checks`), read at most once a minute and shared by its partitions, so that a batch does
/// not ask the catalog (see `Prepared::set_checked`): a constraint added while the engine
/// runs counts within a minute.
#[derive(Default)]
pub(crate) struct Checked(std::sync::Mutex<Option<(Instant, projectionist_postgres::Checks)>>);

impl Checked {
    const EVERY: Duration = Duration::from_secs(60);

    /// The tables, read again when a minute old; `None` when they cannot be read now (the
    /// batch then asks the catalog itself, and waits PostgreSQL out as it does).
    pub(crate) async fn get(
        &self,
        pool: &PgPool,
        projection: &dyn projectionist_postgres::PgProjection,
    ) -> Option<projectionist_postgres::Checks> {
        if let Some((at, tables)) = &*self.0.lock().expect("checked lock") {
            if at.elapsed() < Self::EVERY {
                return Some(tables.clone());
            }
        }
        let tables = projectionist_postgres::checked_tables(pool, projection).await.ok()?;
        *self.0.lock().expect("checked lock") = Some((Instant::now(), tables.clone()));
        Some(tables)
    }
}

/// The batch being applied, in a task of its own: aborted if dropped unfinished (the
/// partition's task ended), so that nothing commits behind a halt's back.
struct InFlight {
    handle: JoinHandle<Applied>,
    /// Its messages.
    size: usize,
    /// Broker timestamp of its first message.
    oldest: Option<i64>,
    /// Where its first message sits, and the aggregate it is about.
    first: (At, String),
    /// Its last message's offset.
    last_offset: i64,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.handle.abort();
    }
}

/// The task's state between two turns of its loop.
struct Task {
    partition: Arc<Partition>,
    batcher: Batcher<Msg>,
    in_flight: Option<InFlight>,
    /// Broker timestamp of the message a halt stopped at.
    halted_at: Option<i64>,
    order: Order,
    /// When a revoked partition stops waiting for its batch in flight.
    revoke_deadline: Option<Instant>,
    /// The high watermark to reach (`exit_when_caught_up`), once read.
    target: Option<i64>,
    markers: MarkerRetry,
    /// When its parked aggregates were last checked for a stale parking.
    swept: Instant,
    /// Batches go one message at a time up to this offset: a batch's task failed there, and
    /// the message at fault is being found (see `Task::panicked`).
    isolating: Option<i64>,
    /// The halt being retried, if one is (see `Task::heal`).
    healing: Option<Healing>,
}

/// Whether the loop goes on.
#[derive(PartialEq, Eq)]
enum Flow {
    Continue,
    Break,
}

impl Partition {
    pub(super) fn name(&self) -> &str {
        self.projection.name()
    }
}

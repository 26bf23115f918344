//! A blue/green rebuild: a projection's read model built again from offset zero beside the
//! live one, by the engine itself writing a shadow schema (see
//! [`projectionist_postgres::rebuild`]), then swapped in once it has caught up with the
//! live checkpoints. The live tables stay complete for their readers all along.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use projectionist_postgres::rebuild::{self, Difference, Swap, Verification};
use projectionist_postgres::{PgPool, PgProjection, SharedProjection};
use sqlx::postgres::PgPoolOptions;
use tracing::Instrument;

use crate::metrics as m;
use crate::scope::Scope;
use crate::{Engine, EngineConfig, Error, Exclusive, Result, RunReport};

/// Most catch-up rounds before a swap is given up: each one reads up to the head as it was
/// when it started, and the swap needs the live checkpoints not ahead of the shadow's.
pub(crate) const MAX_CATCH_UPS: u32 = 20;

/// From which round on, still behind the live run by at most [`HELD_LAG_MAX`] offsets, a
/// rebuild holds the live writers back for its next round (see [`rebuild::hold`]): under a
/// steady stream, a round read to the head as it was at its start always ends a little behind
/// a live run that went on meanwhile.
pub(crate) const HOLD_FROM: u32 = 2;

/// The most offsets the shadow may be behind for its last round to hold the live writers
/// back (they wait for that round: a few hundred milliseconds of reading).
pub(crate) const HELD_LAG_MAX: i64 = 10_000;

/// How often `rebuild` tells what its partitions hold folded.
const FOLDED_EVERY: std::time::Duration = std::time::Duration::from_millis(100);

/// How a rebuild ended.
pub enum Rebuilt {
    /// Swapped in: the rebuilt tables are live, the replaced ones kept for a rollback.
    Swapped {
        /// Whether it resumed the shadow of a rebuild stopped earlier.
        resumed: bool,
        /// What its runs did, the last one's counters.
        report: RunReport,
    },
    /// Verified ([`verify`]): the shadow compared with the live tables at the same offsets,
    /// these tables differing. None: the shadow is dropped; some: it is kept, for `rebuild`
    /// to swap in (it resumes it) or `rebuild --abandon` to drop.
    Verified {
        /// Whether it resumed the shadow of a rebuild stopped earlier.
        resumed: bool,
        /// The tables whose live rows are not the rebuilt ones.
        differences: Vec<Difference>,
    },
    /// Stopped by the shutdown signal before the swap: the next rebuild resumes it.
    Stopped,
}

/// What a rebuild does once its shadow has caught up with the live run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Finish {
    Swap,
    Verify,
}

/// How long [`verify`] waits for a live run behind its shadow to catch up.
const LIVE_CATCH_UP: std::time::Duration = std::time::Duration::from_secs(30);

/// Rebuilds `projection` (consuming `topics`) beside its live tables and swaps it in (see
/// the module). Holds the projection's rebuild lock throughout, so that a second rebuild is
/// refused: the only reader, it assigns itself every partition (see
/// [`Exclusive::sole_reader`]) and joins no group, so it waits for no join, and a rebuild
/// killed and started again never waits for the killed member to leave. It commits offsets
/// under a group of its own, new for each rebuild process,
/// `<group_id>.rebuild-<start, ms since the epoch>.<projection>`; the shadow's checkpoints in
/// PostgreSQL say where it resumes, not the group's offsets.
///
/// `folded` tells, as it goes, the offsets it has read past by folding batches whose rows
/// are not yet written with their checkpoint (up to 100,000 rows or 15 s per partition; see
/// [`Exclusive::fold`]): the shadow's checkpoints plus these are how far it has read,
/// for a progress display.
pub async fn rebuild(
    pool: &PgPool,
    config: EngineConfig,
    projection: SharedProjection,
    topics: Vec<String>,
    folded: &AtomicU64,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<Rebuilt> {
    let name = projection.name().to_owned();
    let rebuilt = build_and_swap(pool, config, projection, topics, folded, shutdown, Finish::Swap)
        .instrument(rebuild_span("rebuild", &name))
        .await;
    ended(&name, &rebuilt);
    rebuilt
}

/// Builds `projection`'s shadow as [`rebuild()`] does and, instead of swapping it in, compares
/// it with the live tables once both have read the topics to the same offsets (see
/// [`projectionist_postgres::rebuild::verify`]): [`Rebuilt::Verified`] with the tables that
/// differ. A live run goes on meanwhile; one behind the shadow is waited for (up to 30 s:
/// a live run stopped behind the stream fails the verification, which names the partitions).
pub async fn verify(
    pool: &PgPool,
    config: EngineConfig,
    projection: SharedProjection,
    topics: Vec<String>,
    folded: &AtomicU64,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<Rebuilt> {
    let name = projection.name().to_owned();
    let verified = build_and_swap(pool, config, projection, topics, folded, shutdown, Finish::Verify)
        .instrument(rebuild_span("verify", &name))
        .await;
    ended(&name, &verified);
    verified
}

/// A rebuild's span (`rebuild` or `verify`): its rounds and its swap are spans within it.
fn rebuild_span(what: &str, name: &str) -> tracing::Span {
    tracing::info_span!("rebuild", otel.name = %format_args!("{what} {name}"), projection = %name)
}

/// The metric of how a rebuild ended (a swap's is counted with its time when it is done).
fn ended(name: &str, rebuilt: &Result<Rebuilt>) {
    match rebuilt {
        Ok(Rebuilt::Swapped { .. }) => {}
        Ok(Rebuilt::Verified { differences, .. }) => {
            m::rebuild_ended(name, if differences.is_empty() { "verified" } else { "differs" }, None)
        }
        Ok(Rebuilt::Stopped) => m::rebuild_ended(name, "stopped", None),
        Err(_) => m::rebuild_ended(name, "failed", None),
    }
}

/// [`rebuild`]'s work: the shadow prepared, built in rounds until it has caught up with the
/// live run, then swapped in (or verified, stopped, or failed).
async fn build_and_swap(
    pool: &PgPool,
    config: EngineConfig,
    projection: SharedProjection,
    topics: Vec<String>,
    folded: &AtomicU64,
    shutdown: impl Future<Output = ()> + Send,
    finish: Finish,
) -> Result<Rebuilt> {
    let name = projection.name().to_owned();
    let lock = rebuild::lock(pool, &name).await?;
    m::rebuild_phase(&name, 1);
    let shadow = match finish {
        Finish::Swap => rebuild::prepare(pool, projection.as_ref()).await?,
        Finish::Verify => rebuild::prepare_to_verify(pool, projection.as_ref()).await?,
    };
    tracing::info!(projection = %name, schema = %shadow.schema, resumed = shadow.resumed, "Rebuild starting.");
    let shadow_pool = shadow_pool(pool, &name).await?;
    let config = shadow_config(config, projection.as_ref());
    let resumed = shadow.resumed;
    let build = Build { pool, shadow_pool, config, projection, topics, folded, resumed, scope: Scope::default() };
    // Behind the rebuild lock, no one else writes the shadow: its batches are folded into
    // each other where they can be (every table but custom ones); and it is the only reader
    // of its group: every partition is its own, assigned without a join.
    let mut exclusive = Exclusive { sole_writer: true, fold: true, sole_reader: true };
    let (stopped, shutdown) = noted(shutdown);
    tokio::pin!(shutdown);
    // Whether the bulk load is done: its secondary indexes made, its statistics read.
    let mut loaded = false;
    // The live writers held back for this round, its last (dropped: let go).
    let mut held: Option<rebuild::Held> = None;
    for round in 1..=MAX_CATCH_UPS {
        let span = tracing::info_span!("round", otel.name = "rebuild round", round, folded = exclusive.fold);
        let report = build.round(exclusive, shutdown.as_mut()).instrument(span).await?;
        if let Some(halt) = report.halts().first() {
            if exclusive.fold {
                // Folded, PostgreSQL cannot name an event it refuses: go again batch by batch
                // from the shadow's checkpoints, which halts (if it does) naming the event.
                let again = "The rebuild halted while folding its batches; going on batch by batch.";
                tracing::warn!(projection = %name, %halt, "{again}");
                exclusive.fold = false;
                continue;
            }
            return Err(problem(&name, format!("it halted, the live tables untouched: {halt}")));
        }
        if stopped.load(Ordering::SeqCst) {
            tracing::info!(projection = %name, "Rebuild stopped before its swap; the next `rebuild` resumes it.");
            return Ok(Rebuilt::Stopped);
        }
        build.caught_up_round(&mut loaded).await?;
        let next = match finish {
            Finish::Verify => build.verify().await?,
            Finish::Swap => {
                let span = tracing::info_span!("swap", otel.name = "rebuild swap", round, held = held.is_some());
                build.swap(held.take(), round, report).instrument(span).await?
            }
        };
        match next {
            Next::Done(rebuilt) => {
                // Its connections given back to the budget now, before the next rebuild's.
                build.shadow_pool.close().await;
                lock.release().await?;
                return Ok(rebuilt);
            }
            Next::Again(hold) => held = hold,
        }
    }
    Err(problem(&name, format!("it did not catch up with the live run in {MAX_CATCH_UPS} rounds; run `rebuild` again")))
}

/// `shutdown`, and whether it has completed: a round ends early on it, and the rounds' loop
/// then stops rather than going on to the swap.
pub(crate) fn noted(shutdown: impl Future<Output = ()> + Send) -> (Arc<AtomicBool>, impl Future<Output = ()> + Send) {
    let stopped = Arc::new(AtomicBool::new(false));
    let flag = stopped.clone();
    (stopped, async move {
        shutdown.await;
        flag.store(true, Ordering::SeqCst);
    })
}

/// What a rebuild (or a repair) has at hand for each of its rounds.
pub(crate) struct Build<'a> {
    pub pool: &'a PgPool,
    pub shadow_pool: PgPool,
    pub config: EngineConfig,
    pub projection: SharedProjection,
    pub topics: Vec<String>,
    pub folded: &'a AtomicU64,
    /// Whether it resumed the shadow of a rebuild stopped earlier.
    pub resumed: bool,
    /// The part of the topics read: a repair's partitions and aggregates, or everything.
    pub scope: Scope,
}

/// What a round's end leads to.
enum Next {
    /// The rebuild is done.
    Done(Rebuilt),
    /// Another round, holding the live writers back for it when given.
    Again(Option<rebuild::Held>),
}

impl Build<'_> {
    fn name(&self) -> &str {
        self.projection.name()
    }

    /// One round: the engine on the shadow, read up to the head as it is now, telling what
    /// it holds folded as it goes.
    pub(crate) async fn round(
        &self,
        exclusive: Exclusive,
        shutdown: std::pin::Pin<&mut (impl Future<Output = ()> + Send)>,
    ) -> Result<RunReport> {
        let engine = Engine::new(self.shadow_pool.clone(), self.config.clone())
            .exclusive(exclusive)
            .scope(self.scope.clone())
            .register(self.projection.clone(), self.topics.clone());
        let stats = engine.stats();
        let run = engine.run(shutdown);
        tokio::pin!(run);
        let report = loop {
            tokio::select! {
                report = &mut run => break report,
                () = tokio::time::sleep(FOLDED_EVERY) => {
                    let folded = stats.iter().map(|s| s.folded.load(Ordering::Relaxed)).sum();
                    self.folded.store(folded, Ordering::Relaxed);
                }
            }
        };
        // The round wrote what it folded (or, halted, left it to be read again).
        self.folded.store(0, Ordering::Relaxed);
        report
    }

    /// After a round that read to the head: the bulk load finished (once), and the dead
    /// letters discarded meanwhile carried over.
    async fn caught_up_round(&self, loaded: &mut bool) -> Result<()> {
        if !*loaded {
            bulk_loaded(self.pool, &self.shadow_pool, self.projection.as_ref()).await?;
            *loaded = true;
        }
        let carried = rebuild::carry_discards(self.pool, &self.shadow_pool, self.projection.as_ref()).await?;
        if carried > 0 {
            let carried_over = "Discarded dead letters met again: discarded in the rebuild too.";
            tracing::info!(projection = %self.name(), carried, "{carried_over}");
        }
        Ok(())
    }

    /// The shadow compared with the live tables, or another round when the live run has read
    /// past it.
    async fn verify(&self) -> Result<Next> {
        Ok(match compared(self.pool, self.projection.as_ref(), &self.topics).await? {
            Some(differences) => Next::Done(Rebuilt::Verified { resumed: self.resumed, differences }),
            None => Next::Again(None),
        })
    }

    /// The shadow swapped in (with the live writers `held` back, when they are), or another
    /// round: behind the live run (from round [`HOLD_FROM`] on, a little behind, with the live
    /// writers held back for it), or dead letters discarded meanwhile to carry over.
    async fn swap(&self, held: Option<rebuild::Held>, round: u32, report: RunReport) -> Result<Next> {
        let (name, projection) = (self.name(), self.projection.as_ref());
        let swapping = std::time::Instant::now();
        m::rebuild_phase(name, 2);
        let swapped = match held {
            Some(held) => rebuild::swap_held(held, projection, &self.topics).await?,
            None => rebuild::swap(self.pool, projection, &self.topics).await?,
        };
        match swapped {
            Swap::Done => {
                let swap = swapping.elapsed();
                m::rebuild_ended(name, "swapped", Some(swap));
                let swap_ms = swap.as_millis() as u64;
                let swapped = "Rebuild swapped in; the replaced tables are kept for a rollback.";
                tracing::info!(projection = %name, swap_ms, "{swapped}");
                Ok(Next::Done(Rebuilt::Swapped { resumed: self.resumed, report }))
            }
            Swap::Behind(partitions) => {
                m::rebuild_phase(name, 1);
                tracing::info!(projection = %name, round, behind = ?partitions, "The live run is ahead; catching up.");
                let lag: i64 = partitions.iter().map(|(_, _, shadow, live)| live - shadow.unwrap_or(0)).sum();
                if round >= HOLD_FROM && lag <= HELD_LAG_MAX {
                    let holding = "The live run keeps moving ahead: its writers wait for the last round.";
                    tracing::info!(projection = %name, round, lag, "{holding}");
                    return Ok(Next::Again(Some(rebuild::hold(self.pool, name).await?)));
                }
                Ok(Next::Again(None))
            }
            Swap::Undiscarded(ids) => {
                m::rebuild_phase(name, 1);
                let again = "Dead letters discarded during the swap's preparation; carrying them over first.";
                tracing::info!(projection = %name, round, dead_letters = ?ids, "{again}");
                Ok(Next::Again(None))
            }
        }
    }
}

/// The shadow compared with the live tables (see [`verify`]): the tables that differ, or
/// `None` when the live run has read past the shadow (another round catches it up). The
/// shadow is dropped when none differ.
async fn compared(pool: &PgPool, projection: &dyn PgProjection, topics: &[String]) -> Result<Option<Vec<Difference>>> {
    let name = projection.name();
    let waiting = std::time::Instant::now();
    loop {
        match rebuild::verify(pool, projection, topics).await? {
            Verification::Compared(differences) => {
                if differences.is_empty() {
                    rebuild::abandon(pool, name).await?;
                }
                return Ok(Some(differences));
            }
            Verification::ShadowBehind(_) => return Ok(None),
            Verification::LiveBehind(partitions) if waiting.elapsed() >= LIVE_CATCH_UP => {
                let behind = partitions
                    .iter()
                    .map(|(topic, partition, shadow, live)| {
                        format!(
                            "{topic}/{partition} (live at {}, the rebuild at {})",
                            live.unwrap_or(0),
                            shadow.unwrap_or(0)
                        )
                    })
                    .collect::<Vec<_>>()
                    .join(", ");
                let problem_ = format!(
                    "the live run stayed behind the stream the rebuild read, at {behind}, for {}s: a verification \
                     compares both at the same offsets (is `run` running?)",
                    LIVE_CATCH_UP.as_secs()
                );
                return Err(problem(name, problem_));
            }
            Verification::LiveBehind(_) => tokio::time::sleep(std::time::Duration::from_millis(500)).await,
        }
    }
}

/// The settings a rebuild's shadow runs with: `config` in a group of its own, new for each
/// rebuild process, read up to the head; a projection with a custom table in a rebuild's
/// larger batches (the others fold across a run's).
pub(crate) fn shadow_config(mut config: EngineConfig, projection: &dyn PgProjection) -> EngineConfig {
    let started = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_millis();
    let prefix = config.group_id.as_deref().unwrap_or("projectionist");
    config.group_id = Some(format!("{prefix}.rebuild-{started}"));
    config.exit_when_caught_up = true;
    if projection.tables().iter().any(|t| t.gate() == projectionist_core::Gate::Custom) {
        config.batch_max_events = config.rebuild_batch_max_events;
        config.batch_max_bytes = config.rebuild_batch_max_bytes;
    }
    config.from_beginning = false;
    config
}

/// The bulk load is done: the shadow's secondary indexes made, and its tables' statistics
/// read once, here, for the live run and the readers after the swap (the partitions read
/// them while they fill the tables, not at the end of their reading).
async fn bulk_loaded(pool: &PgPool, shadow_pool: &PgPool, projection: &dyn PgProjection) -> Result<()> {
    let indexes = rebuild::create_indexes(pool, projection).await?;
    if indexes > 0 {
        tracing::info!(projection = %projection.name(), indexes, "Bulk load done; secondary indexes created.");
    }
    let mut conn = shadow_pool.acquire().await.map_err(projectionist_postgres::Error::from)?;
    projectionist_postgres::analyze(&mut conn, projection).await?;
    Ok(())
}

pub(crate) fn problem(projection: &str, problem: String) -> Error {
    Error::Postgres(projectionist_postgres::RebuildError { projection: projection.to_owned(), problem }.into())
}

/// The connections of `pool` a rebuild keeps for its own work beside its shadow's
/// partitions: its lock, the live writers it holds for its last round, one for its checks
/// and swap, one for a progress display. The shadow's pool has the rest of `pool`'s size.
pub const OWN_CONNECTIONS: u32 = 4;

/// A pool like `pool` whose connections resolve names in `projection`'s shadow first, of
/// `pool`'s size but the rebuild's own [`OWN_CONNECTIONS`] (at least one): both pools
/// together keep within `pool`'s size, the process's connection budget.
pub(crate) async fn shadow_pool(pool: &PgPool, projection: &str) -> Result<PgPool> {
    let mut conn = pool.acquire().await.map_err(projectionist_postgres::Error::from)?;
    let path = rebuild::shadow_search_path(&mut conn, projection).await?;
    drop(conn);
    let projection = projection.to_owned();
    let options = (*pool.connect_options()).clone();
    let pool = PgPoolOptions::new()
        .max_connections(pool.options().get_max_connections().saturating_sub(OWN_CONNECTIONS).max(1))
        .acquire_timeout(pool.options().get_acquire_timeout())
        .after_connect(move |conn, _| {
            let (path, projection) = (path.clone(), projection.clone());
            Box::pin(async move {
                rebuild::enter_shadow(conn, &path, &projection).await.map_err(|e| match e {
                    projectionist_postgres::Error::Database(e) => e,
                    other => sqlx::Error::Protocol(other.to_string()),
                })
            })
        })
        .connect_with(options)
        .await
        .map_err(projectionist_postgres::Error::from)?;
    Ok(pool)
}

//! The engine: one group consumer per registered projection, run side by side.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use projectionist_postgres::{check_tables, PgPool, SharedProjection};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{Consumer, StreamConsumer};
use tokio::sync::{mpsc, watch};

use crate::context::{EngineContext, Rebalance};
use crate::outage::Outage;
use crate::retry::Retry;
use crate::runner::{Member, Runner};
use crate::scope::Scope;
use crate::stats::Stats;
use crate::tp::Tp;
use crate::{EngineConfig, Error, Exclusive, Result};

/// A projection and the topics it consumes.
#[derive(Clone)]
pub struct Registration {
    /// The projection.
    pub projection: SharedProjection,
    /// Its topics.
    pub topics: Vec<String>,
}

/// Drives registered projections from Kafka into PostgreSQL.
///
/// ```no_run
/// # async fn demo(
/// #     pool: sqlx::PgPool,
/// #     projection: projectionist_postgres::SharedProjection,
/// # ) -> projectionist_kafka::Result<()> {
/// use projectionist_kafka::{Engine, EngineConfig};
///
/// let engine = Engine::new(pool, EngineConfig::new("localhost:9092")).register(projection, ["bank.accounts"]);
/// let report = engine.run(async { tokio::signal::ctrl_c().await.ok(); }).await?;
/// # Ok(()) }
/// ```
pub struct Engine {
    pool: PgPool,
    config: EngineConfig,
    exclusive: Exclusive,
    scope: Arc<Scope>,
    registrations: Vec<Registration>,
    stats: Vec<Arc<Stats>>,
    joined: Vec<Arc<AtomicBool>>,
    unreachable: Vec<Arc<AtomicBool>>,
}

/// Whether the engine is ready: every projection's consumer holds an assignment from its
/// group, the brokers answer, PostgreSQL answers, no partition waits for PostgreSQL to come
/// back and none is halted.
#[derive(Clone)]
pub struct Readiness {
    pool: PgPool,
    joined: Vec<Arc<AtomicBool>>,
    unreachable: Vec<Arc<AtomicBool>>,
    stats: Vec<Arc<Stats>>,
}

/// What [`Readiness::state`] found; ready when all is well. Its `Display` says what is not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadyState {
    /// Every projection's consumer holds a partition assignment.
    pub partitions_assigned: bool,
    /// Every projection's consumer reaches a broker of its cluster: false from librdkafka's
    /// "all brokers down" until its statistics (every `statistics.interval.ms`, 5 s by
    /// default) see a broker up again. The consumer reconnects by itself meanwhile.
    pub broker_answers: bool,
    /// PostgreSQL answers `SELECT 1` within a second.
    pub postgres_answers: bool,
    /// Some partition (or checkpoint read) waits for PostgreSQL to come back: unreachable,
    /// restarting or read-only. It resumes by itself.
    pub waiting_for_postgres: bool,
    /// Some partition waits for the schema registry to answer. It resumes by itself.
    pub waiting_for_registry: bool,
    /// Partitions halted in this process: they stay halted until it restarts.
    pub partitions_halted: usize,
}

impl ReadyState {
    /// Assigned, PostgreSQL answering, nothing waiting, nothing halted.
    pub fn is_ready(&self) -> bool {
        self.partitions_assigned
            && self.broker_answers
            && self.postgres_answers
            && !self.waiting_for_postgres
            && !self.waiting_for_registry
            && self.partitions_halted == 0
    }
}

impl fmt::Display for ReadyState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "partitions assigned: {}, broker answers: {}, postgres answers: {}, waiting for postgres: {}, \
            waiting for the schema registry: {}, partitions halted: {}",
            self.partitions_assigned,
            self.broker_answers,
            self.postgres_answers,
            self.waiting_for_postgres,
            self.waiting_for_registry,
            self.partitions_halted
        )
    }
}

impl Readiness {
    /// Every projection's consumer holds a partition assignment.
    pub fn partitions_assigned(&self) -> bool {
        !self.joined.is_empty() && self.joined.iter().all(|j| j.load(Ordering::SeqCst))
    }

    /// Every projection's consumer reaches a broker (see [`ReadyState::broker_answers`]).
    pub fn broker_answers(&self) -> bool {
        self.unreachable.iter().all(|u| !u.load(Ordering::SeqCst))
    }

    /// PostgreSQL answers `SELECT 1` within a second.
    pub async fn postgres_answers(&self) -> bool {
        let ping = sqlx::query_scalar::<_, i32>("SELECT 1").fetch_one(&self.pool);
        matches!(tokio::time::timeout(std::time::Duration::from_secs(1), ping).await, Ok(Ok(1)))
    }

    /// Some partition of some projection waits for PostgreSQL to come back.
    pub fn waiting_for_postgres(&self) -> bool {
        self.stats.iter().any(|s| s.waiting_for_postgres())
    }

    /// Some partition of some projection waits for the schema registry to answer.
    pub fn waiting_for_registry(&self) -> bool {
        self.stats.iter().any(|s| s.waiting_for_registry())
    }

    /// Partitions halted in this process, over all projections.
    pub fn partitions_halted(&self) -> usize {
        self.stats.iter().map(|s| s.partitions_halted()).sum()
    }

    /// Each halt of this process, naming topic, partition, offset and reason (and, for a
    /// halt being retried, since when and when next).
    pub fn halts(&self) -> Vec<String> {
        self.stats.iter().flat_map(|s| s.halts.lock().map(|h| h.clone()).unwrap_or_default()).collect()
    }

    /// All of the above.
    pub async fn state(&self) -> ReadyState {
        ReadyState {
            partitions_assigned: self.partitions_assigned(),
            broker_answers: self.broker_answers(),
            postgres_answers: self.postgres_answers().await,
            waiting_for_postgres: self.waiting_for_postgres(),
            waiting_for_registry: self.waiting_for_registry(),
            partitions_halted: self.partitions_halted(),
        }
    }

    /// Whether [`Readiness::state`] is ready.
    pub async fn is_ready(&self) -> bool {
        self.state().await.is_ready()
    }

    /// The engine's pool (for pool gauges).
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }
}

/// What a run did, per projection.
#[derive(Debug)]
pub struct RunReport {
    /// Projection name and its counters.
    pub projections: Vec<(String, Arc<Stats>)>,
}

impl RunReport {
    /// Logs an error for each partition whose messages read do not add up to their outcomes
    /// (see [`crate::Accounting`]): one counted twice or not at all, which is a bug.
    fn check_accounting(&self) {
        for (name, stats) in &self.projections {
            for (topic, partition, accounting) in stats.partitions().into_iter().filter(|(_, _, a)| !a.adds_up()) {
                let message =
                    "The messages this partition read do not add up to their outcomes (a bug; please report it).";
                tracing::error!(projection = %name, %topic, partition, %accounting, "{message}");
            }
        }
    }

    /// Every partition halt, as messages naming topic, partition, offset and reason.
    pub fn halts(&self) -> Vec<String> {
        self.projections.iter().flat_map(|(_, s)| s.halts.lock().expect("halts lock").clone()).collect()
    }
}

impl Engine {
    /// An engine writing to `pool`.
    pub fn new(pool: PgPool, config: EngineConfig) -> Self {
        Self {
            pool,
            config,
            exclusive: Exclusive::default(),
            scope: Arc::default(),
            registrations: Vec::new(),
            stats: Vec::new(),
            joined: Vec::new(),
            unreachable: Vec::new(),
        }
    }

    /// What the engine may assume it has to itself (see [`Exclusive`]): `rebuild`'s, behind
    /// its lock. Nothing, by default.
    pub fn exclusive(mut self, exclusive: Exclusive) -> Self {
        self.exclusive = exclusive;
        self
    }

    /// The part of its topics the engine reads (see [`Scope`]): a repair's. Everything, by
    /// default. Needs [`Exclusive::sole_reader`] to narrow the partitions.
    pub(crate) fn scope(mut self, scope: Scope) -> Self {
        self.scope = Arc::new(scope);
        self
    }

    /// Adds a projection consuming `topics`.
    pub fn register<I, S>(mut self, projection: SharedProjection, topics: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.registrations.push(Registration { projection, topics: topics.into_iter().map(Into::into).collect() });
        self.stats.push(Arc::default());
        self.joined.push(Arc::default());
        self.unreachable.push(Arc::default());
        self
    }

    /// A readiness probe for this engine's projections, to hand to a health endpoint.
    pub fn readiness(&self) -> Readiness {
        Readiness {
            pool: self.pool.clone(),
            joined: self.joined.clone(),
            unreachable: self.unreachable.clone(),
            stats: self.stats.clone(),
        }
    }

    /// Live counters, in registration order, to watch a run from another task.
    pub fn stats(&self) -> Vec<Arc<Stats>> {
        self.stats.clone()
    }

    /// Runs until `shutdown` completes (or, with `exit_when_caught_up`, until every
    /// projection has caught up), then finishes in-flight batches, commits and returns.
    ///
    /// Refuses to start ([`projectionist_postgres::Error::Drift`]) when a projection's table
    /// does not exist or differs from its declaration (see `projectionist_postgres::migrate`).
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send) -> Result<RunReport> {
        if self.registrations.is_empty() {
            return Err(Error::Config("no projection registered".into()));
        }
        tokio::pin!(shutdown);
        if !self.check_tables(shutdown.as_mut()).await? {
            let projections =
                self.registrations.iter().zip(&self.stats).map(|(r, s)| (r.projection.name().to_owned(), s.clone()));
            return Ok(RunReport { projections: projections.collect() });
        }
        for name in self.config.per_projection.keys() {
            if !self.registrations.iter().any(|r| r.projection.name() == name) {
                let registered: Vec<&str> = self.registrations.iter().map(|r| r.projection.name()).collect();
                return Err(Error::Config(format!(
                    "per_projection names {name:?}, which is not registered; registered: {}",
                    registered.join(", ")
                )));
            }
        }
        let (stop_tx, stop_rx) = watch::channel(false);
        let mut tasks = Vec::new();
        let mut report = RunReport { projections: Vec::new() };
        for (i, reg) in self.registrations.iter().enumerate() {
            let (stats, joined) = (&self.stats[i], &self.joined[i]);
            let name = reg.projection.name().to_owned();
            let group = self.config.group_for(&name);
            let (rebalances_tx, rebalances) = mpsc::unbounded_channel();
            let context = EngineContext::new(name.clone(), rebalances_tx.clone(), self.unreachable[i].clone());
            let consumer = Arc::new(self.consumer(reg, &group, context)?);
            if self.exclusive.sole_reader {
                let mut parts = every_partition(consumer.clone(), reg.topics.clone()).await?;
                parts.retain(|tp| self.scope.reads(tp));
                let _ = rebalances_tx.send(Rebalance::Assign(parts));
            }
            tracing::info!(projection = %name, topics = ?reg.topics, group = %group, "Projection starting.");
            let member = Member { group, consumer, rebalances };
            let (pool, config) = (self.pool.clone(), self.config.for_projection(&name));
            let dead_letter_topic = crate::dead_letters::DeadLetterTopic::from_config(&config)?;
            let projection = projectionist_postgres::Formatted::wrap(reg.projection.clone(), &self.config.topics);
            let runner = Runner::new(projection, pool, config, member, stats.clone(), joined.clone())
                .with_dead_letter_topic(dead_letter_topic)
                .exclusive(self.exclusive)
                .scope(self.scope.clone());
            tasks.push(tokio::spawn(runner.run(stop_rx.clone())));
            report.projections.push((name, stats.clone()));
        }
        supervise(tasks, shutdown.as_mut(), &stop_tx).await?;
        report.check_accounting();
        Ok(report)
    }

    /// Checks every projection's tables against their declarations before a message is
    /// read (a column missing from a table created before its declaration changed would
    /// otherwise halt the first batch), waiting PostgreSQL out as a batch would. `false`:
    /// `shutdown` came first.
    async fn check_tables(&self, mut shutdown: Pin<&mut impl Future<Output = ()>>) -> Result<bool> {
        let retry = self.config.retry_policy();
        for (reg, stats) in self.registrations.iter().zip(&self.stats) {
            let mut outage = Outage::new(stats.clone(), reg.projection.name());
            let checked = retry
                .run_until(
                    || check_tables(&self.pool, reg.projection.as_ref()),
                    Retry::of,
                    |e, retrying| {
                        if retrying.kind == Retry::WaitOut {
                            outage.failed(e, retrying);
                        }
                    },
                    shutdown.as_mut(),
                )
                .await;
            match checked {
                None => return Ok(false),
                Some(checked) => checked?,
            }
            outage.over();
        }
        Ok(true)
    }

    fn consumer(
        &self,
        reg: &Registration,
        group: &str,
        context: EngineContext,
    ) -> Result<StreamConsumer<EngineContext>> {
        let name = reg.projection.name().to_owned();
        // Defaults a user may override: a short session keeps group joins quick (some
        // brokers delay the first join by a share of it). Each partition has its own
        // prefetch queue, so librdkafka's bound (64 MiB by default) applies per partition:
        // 2 MiB keeps memory flat (the bench's RSS arm), and a short back-off when that
        // bound is reached (1 s by default) keeps the queue fed. Security settings come
        // with the user's properties, as for every other client.
        let mut cfg: ClientConfig = self.config.client.client_config_with_defaults(&[
            ("session.timeout.ms", "6000"),
            ("heartbeat.interval.ms", "2000"),
            // Eager: a group's members must all use one protocol, and eager is what earlier
            // releases used (cooperative-sticky is supported: see docs/operations.md).
            ("partition.assignment.strategy", "range"),
            ("max.poll.interval.ms", "60000"),
            ("statistics.interval.ms", "5000"),
            ("queued.max.messages.kbytes", "2048"),
            ("fetch.queue.backoff.ms", "10"),
            // At the head, a fetch returns within this of new data even on a broker that
            // holds an empty fetch for its whole wait (tansu does; Apache Kafka answers as
            // soon as data arrives, so there it only means more empty fetches while idle):
            // what a read-your-writes wait adds to the broker's own latency.
            ("fetch.wait.max.ms", "10"),
        ]);
        // What the engine's guarantees rest on: not overridable.
        cfg.set("group.id", group)
            .set("client.id", format!("projectionist-{name}"))
            .set("isolation.level", "read_committed")
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "earliest")
            .set("enable.partition.eof", "false");
        if let Some(id) = &self.config.group_instance_id {
            cfg.set("group.instance.id", id);
        }
        let consumer: StreamConsumer<EngineContext> = cfg.create_with_context(context)?;
        if !self.exclusive.sole_reader {
            let topics: Vec<&str> = reg.topics.iter().map(String::as_str).collect();
            consumer.subscribe(&topics)?;
        }
        Ok(consumer)
    }
}

/// Waits for the projections' runners (`tasks`) to end, telling them all to stop once
/// `shutdown` completes or one of them fails (an error, or a panic: never silence while
/// the others go on). The first failure is the run's.
async fn supervise(
    tasks: Vec<tokio::task::JoinHandle<Result<()>>>,
    shutdown: Pin<&mut impl Future<Output = ()>>,
    stop: &watch::Sender<bool>,
) -> Result<()> {
    use futures_util::StreamExt;
    let mut running: futures_util::stream::FuturesUnordered<_> = tasks.into_iter().collect();
    let mut shutdown = shutdown;
    let mut failed = None;
    loop {
        tokio::select! {
            ended = running.next() => match ended {
                None => break,
                Some(Ok(Ok(()))) => {}
                Some(ended) => {
                    let e = ended.map_err(|e| Error::Task(e.to_string())).and_then(|r| r).err();
                    if let (Some(e), None) = (e, &failed) {
                        tracing::error!(error = %e, "A projection's runner failed; stopping the others.");
                        let _ = stop.send(true);
                        failed = Some(e);
                    }
                }
            },
            () = &mut shutdown, if !*stop.borrow() => {
                tracing::info!("Shutdown requested; finishing in-flight batches.");
                let _ = stop.send(true);
            }
        }
    }
    failed.map_or(Ok(()), Err)
}

/// Every partition of `topics`, from the broker's metadata: what a sole reader assigns
/// itself (see [`Exclusive::sole_reader`]).
async fn every_partition(consumer: Arc<StreamConsumer<EngineContext>>, topics: Vec<String>) -> Result<Vec<Tp>> {
    let listed = tokio::task::spawn_blocking(move || {
        let mut parts = Vec::new();
        for topic in topics {
            let partitions = crate::topics::partitions_of(consumer.as_ref(), &topic)?;
            parts.extend(partitions.into_iter().map(|p| Tp::new(topic.as_str(), p)));
        }
        Ok(parts)
    });
    listed.await.map_err(|e| Error::Task(e.to_string()))?
}

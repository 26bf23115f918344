//! Reading your own writes: wait until a projection has applied an event.
//!
//! A batch commits its checkpoint (the next offset to read) in the same transaction as its
//! rows, so "partition P of topic T is applied up to offset O" is a fact PostgreSQL tells,
//! visible exactly when the rows are. [`Waiter`] waits for that fact, or for an aggregate's
//! row to reach a version, without a Kafka client: once each batch's transaction commits, one
//! small notification per partition goes out on [`CHANNEL`] (never one per event; see
//! [`crate::writing::checkpoint::notify`] for why after the commit, not in it); one listening
//! connection per [`Waiter`] wakes every waiter it concerns. A notification missed (the
//! listening connection lost, PostgreSQL restarting, the projector stopped between its commit
//! and its notification) is made up by reading the checkpoints again, at once after a
//! reconnect and every [`POLL`] while anyone waits; a wait never outlasts its timeout.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Deserialize;
use sqlx::postgres::PgListener;
use sqlx::PgPool;
use tokio::sync::oneshot;

use crate::error::{Error, MigrateError, Result, WaitError};
use crate::projection::PgProjection;

mod fate;
mod versions;
pub use crate::error::answer::{Fate, Position};
use versions::{VersionQuery, Watched};

/// The channel batches notify on: a JSON object per batch and partition, `{"schema",
/// "projection", "topic", "partition", "next_offset", "from", "kept_out"}` (the schema the
/// checkpoint was written in: a rebuild's shadow is not the live read model; `from` and
/// `kept_out`, when not null, what the checkpoint passed: see
/// [`crate::writing::checkpoint::Passed`]).
pub const CHANNEL: &str = "projectionist_checkpoint";

/// How often the checkpoints are read again while anyone waits, in case a notification was
/// missed.
pub const POLL: Duration = Duration::from_secs(1);

/// How often connecting to listen is tried again while PostgreSQL cannot be reached.
pub const RECONNECT: Duration = Duration::from_secs(1);

/// A partition of a projection's topic.
type Partition = (String, String, i32);

/// Waits for projections to apply events; cheap to clone (clones share one listening
/// connection, taken from the pool given to [`Waiter::new`], and its task).
#[derive(Clone)]
pub struct Waiter {
    inner: Arc<Inner>,
}

struct Inner {
    pool: PgPool,
    /// The schema the pool's connections find `projectionist_checkpoints` in: notifications
    /// from elsewhere (a rebuild's shadow) are not the live read model's.
    schema: String,
    /// Per partition someone waits on: the highest next offset seen, and the waits.
    offsets: Mutex<HashMap<Partition, Followed>>,
    /// Per projection someone waits on a version of: the waits, read together whenever it
    /// may have moved.
    versions: Mutex<HashMap<String, Watched>>,
    /// Per partition waited on: which offsets its checkpoint passed were kept out of the
    /// read model (one read at a time per partition).
    kept_out: Mutex<HashMap<Partition, Arc<tokio::sync::Mutex<fate::KeptOut>>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A partition followed for its waits.
#[derive(Default)]
struct Followed {
    /// The highest next offset seen (`None`: not read yet, or nothing checkpointed).
    next: Option<i64>,
    /// The waits, by the offset each waits for: a commit wakes only those it reaches (so
    /// that thousands of waits on one partition cost nothing per commit that passes them by).
    waits: BTreeMap<i64, Vec<oneshot::Sender<i64>>>,
}

impl Followed {
    /// Records `next` (never moving back) and wakes the waits it reaches.
    fn seen(&mut self, next: i64) {
        if self.next.is_some_and(|known| known >= next) {
            return;
        }
        self.next = Some(next);
        let later = self.waits.split_off(&next);
        for wait in std::mem::replace(&mut self.waits, later).into_values().flatten() {
            let _ = wait.send(next);
        }
    }

    /// Forgets the waits that gave up (timed out, or dropped); whether any are left.
    fn prune(&mut self) -> bool {
        self.waits.retain(|_, waits| {
            waits.retain(|w| !w.is_closed());
            !waits.is_empty()
        });
        !self.waits.is_empty()
    }
}

#[derive(Deserialize)]
struct Notified {
    schema: String,
    projection: String,
    topic: String,
    partition: i32,
    next_offset: i64,
    #[serde(default)]
    from: Option<i64>,
    #[serde(default)]
    kept_out: Option<Vec<i64>>,
}

impl Waiter {
    /// A waiter reading `pool`'s database; it listens on one connection of the pool for as
    /// long as a clone of it lives, and reads the checkpoints again every [`POLL`] while
    /// anyone waits.
    pub async fn new(pool: PgPool) -> Result<Self> {
        Self::with_poll(pool, POLL).await
    }

    /// [`Waiter::new`] reading the checkpoints again every `poll` (rather than [`POLL`])
    /// while anyone waits, in case a notification was missed.
    pub async fn with_poll(pool: PgPool, poll: Duration) -> Result<Self> {
        let schema: Option<String> = sqlx::query_scalar(
            "SELECT n.nspname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE c.oid = to_regclass('projectionist_checkpoints')",
        )
        .fetch_one(&pool)
        .await?;
        let schema = schema.ok_or(MigrateError::NotMigrated)?;
        // Listening before it returns, so that the first waits are woken by notifications
        // (if it cannot listen now, its task keeps trying, and the waits poll meanwhile).
        let listener = connect_listener(&pool).await.ok();
        let inner = Arc::new_cyclic(|weak: &std::sync::Weak<Inner>| {
            let weak = weak.clone();
            let listening = pool.clone();
            Inner {
                pool,
                schema,
                offsets: Mutex::new(HashMap::new()),
                versions: Mutex::new(HashMap::new()),
                kept_out: Default::default(),
                task: tokio::spawn(listen(listening, listener, weak, poll)),
            }
        });
        Ok(Self { inner })
    }

    /// Waits until `projection` has applied and committed the message at `offset` of
    /// `topic`'s `partition` (the offset a producer's delivery report gives for the event):
    /// its checkpoint, the next offset to read, is past it, and the event is in the read
    /// model. Returns at once when it is already; [`WaitError::NotApplied`], saying what became
    /// of it, when the checkpoint passed it but it was parked, dead-lettered or discarded;
    /// [`WaitError::Timeout`], saying where the projection stands, when `timeout` passes
    /// first.
    pub async fn wait_for_offset(
        &self,
        projection: &str,
        topic: &str,
        partition: i32,
        offset: i64,
        timeout: Duration,
    ) -> Result<Position> {
        let position = self.wait_for_checkpoint(projection, topic, partition, offset, timeout).await?;
        let Position::Offset { next_offset: Some(next) } = position else { return Ok(position) };
        let may_be_kept_out = {
            let key = (projection.to_owned(), topic.to_owned(), partition);
            let kept_out = self.inner.kept_out.lock().expect("kept-out lock").entry(key).or_default().clone();
            let at = (projection, topic, partition);
            let mut kept_out = kept_out.lock().await;
            kept_out.may_be_kept_out(&self.inner.pool, at, offset, next).await?
        };
        if !may_be_kept_out {
            return Ok(position);
        }
        match fate::of(&self.inner.pool, projection, topic, partition, offset).await? {
            None => Ok(position),
            Some(fate) => {
                let wanted = format!("{projection} to apply offset {offset} of {topic}/{partition}");
                Err(WaitError::NotApplied { wanted, fate }.into())
            }
        }
    }

    /// Waits until `projection`'s checkpoint on `topic`/`partition` is past `offset`.
    async fn wait_for_checkpoint(
        &self,
        projection: &str,
        topic: &str,
        partition: i32,
        offset: i64,
        timeout: Duration,
    ) -> Result<Position> {
        let key = (projection.to_owned(), topic.to_owned(), partition);
        // Registered before reading, so that a commit between the read and the wait wakes it.
        let (woken, unknown) = {
            let mut offsets = self.inner.offsets.lock().expect("offsets lock");
            let followed = offsets.entry(key.clone()).or_default();
            if let Some(next) = followed.next.filter(|next| *next > offset) {
                return Ok(Position::Offset { next_offset: Some(next) });
            }
            let (wake, woken) = oneshot::channel();
            followed.waits.entry(offset).or_default().push(wake);
            (woken, followed.next.is_none())
        };
        // A partition someone already waits on is followed by the notifications (and the
        // polls): what it holds is current but for the commits they are about to tell.
        if unknown {
            let stored = read_offset(&self.inner.pool, &key).await?;
            self.inner.seen_offset(&key, stored);
        }
        match tokio::time::timeout(timeout, woken).await {
            Ok(woken) => {
                let next = woken.expect("a wait's sender is kept until it is woken or gives up");
                Ok(Position::Offset { next_offset: Some(next) })
            }
            Err(_) => Err(Error::Wait(WaitError::Timeout {
                waited_ms: timeout.as_millis() as u64,
                wanted: format!("{projection} to apply offset {offset} of {topic}/{partition}"),
                position: Position::Offset { next_offset: self.inner.next_offset(&key) },
            })),
        }
    }

    /// Waits until `projection`'s rows of the aggregate `aggregate_type`/`aggregate_id`
    /// stand at `version` or beyond (in any gated table of the projection that owns the
    /// type, or its aggregate versions: the gates of an event move together, in its
    /// batch's transaction). Returns at once when they do; [`WaitError::Timeout`], saying
    /// the version they stand at, when `timeout` passes first.
    pub async fn wait_for_version(
        &self,
        projection: &dyn PgProjection,
        aggregate_type: &str,
        aggregate_id: &str,
        version: i64,
        timeout: Duration,
    ) -> Result<Position> {
        let name = projection.name().to_owned();
        let aggregate = (aggregate_type.to_owned(), aggregate_id.to_owned());
        // Registered before reading, so that a commit between the read and the wait wakes it.
        let (woken, query) = {
            let mut versions = self.inner.versions.lock().expect("versions lock");
            let watched = match versions.entry(name.clone()) {
                std::collections::hash_map::Entry::Occupied(watched) => watched.into_mut(),
                std::collections::hash_map::Entry::Vacant(entry) => entry.insert(Watched {
                    query: Arc::new(VersionQuery::of(projection)?),
                    waits: HashMap::new(),
                    reading: false,
                    again: false,
                }),
            };
            let (wake, woken) = oneshot::channel();
            watched.waits.entry(aggregate.clone()).or_default().push((version, wake));
            (woken, watched.query.clone())
        };
        let stands = || async {
            let read = query.read(&self.inner.pool, &name, std::slice::from_ref(&aggregate)).await?;
            Ok::<_, Error>(read.into_iter().next().and_then(|(_, v)| v))
        };
        let now = stands().await?;
        let reached = if now.is_some_and(|v| v >= version) {
            now
        } else {
            match tokio::time::timeout(timeout, woken).await {
                Ok(woken) => Some(woken.expect("a wait's sender is kept until it is woken or gives up")),
                Err(_) => None,
            }
        };
        match reached {
            // The aggregate is past the version; it may have been moved past it on purpose.
            Some(reached) => match fate::of_version(&self.inner.pool, &name, &aggregate, version).await? {
                None => Ok(Position::Version { version: Some(reached) }),
                Some(fate) => {
                    let wanted = format!("{name} to apply {aggregate_type}/{aggregate_id} v{version}");
                    Err(WaitError::NotApplied { wanted, fate }.into())
                }
            },
            None => Err(Error::Wait(WaitError::Timeout {
                waited_ms: timeout.as_millis() as u64,
                wanted: format!("{name} to apply {aggregate_type}/{aggregate_id} v{version}"),
                position: Position::Version { version: stands().await.unwrap_or(now) },
            })),
        }
    }

    /// Waits under way, for the metrics.
    pub fn waiting(&self) -> usize {
        let offsets: usize = self
            .inner
            .offsets
            .lock()
            .expect("offsets lock")
            .values()
            .map(|f| f.waits.values().flatten().filter(|w| !w.is_closed()).count())
            .sum();
        let versions: usize = self
            .inner
            .versions
            .lock()
            .expect("versions lock")
            .values()
            .map(|w| w.waits.values().flatten().filter(|(_, wait)| !wait.is_closed()).count())
            .sum();
        offsets + versions
    }
}

impl Inner {
    /// Records that `key` has been applied up to `next` (never moving back), waking the
    /// waits that reaches.
    fn seen_offset(&self, key: &Partition, next: Option<i64>) {
        let Some(next) = next else { return };
        if let Some(followed) = self.offsets.lock().expect("offsets lock").get_mut(key) {
            followed.seen(next);
        }
    }

    /// Records what `key`'s checkpoint passed from `from` to `next`, as its notification
    /// told (see [`crate::writing::checkpoint::Passed`]), where the partition's waits follow it
    /// from there; else (or while a read of it is under way) its waits read it themselves.
    fn passed(&self, key: &Partition, from: i64, next: i64, kept_out: &[i64]) {
        let Some(known) = self.kept_out.lock().expect("kept-out lock").get(key).cloned() else { return };
        if let Ok(mut known) = known.try_lock() {
            known.passed(from, next, kept_out);
        };
    }

    /// The highest next offset seen on `key`.
    fn next_offset(&self, key: &Partition) -> Option<i64> {
        self.offsets.lock().expect("offsets lock").get(key).and_then(|f| f.next)
    }

    /// Reads the versions `projection`'s waits want again (one read at a time per
    /// projection; one more after it when it may have moved meanwhile), waking those reached.
    fn moved(self: &Arc<Self>, projection: &str) {
        let mut versions = self.versions.lock().expect("versions lock");
        let Some(watched) = versions.get_mut(projection) else { return };
        if watched.reading {
            watched.again = true;
            return;
        }
        watched.reading = true;
        let (inner, projection) = (self.clone(), projection.to_owned());
        tokio::spawn(async move { inner.read_versions(&projection).await });
    }

    async fn read_versions(&self, projection: &str) {
        loop {
            let (query, aggregates) = {
                let mut versions = self.versions.lock().expect("versions lock");
                let Some(watched) = versions.get_mut(projection) else { return };
                watched.again = false;
                if !watched.prune() {
                    watched.reading = false;
                    return;
                }
                (watched.query.clone(), watched.waits.keys().cloned().collect::<Vec<_>>())
            };
            let read = query.read(&self.pool, projection, &aggregates).await;
            let mut versions = self.versions.lock().expect("versions lock");
            let Some(watched) = versions.get_mut(projection) else { return };
            match read {
                Ok(found) => {
                    for (aggregate, version) in found {
                        if let Some(version) = version {
                            watched.reached(&aggregate, version);
                        }
                    }
                }
                // Read again at the next notification or poll.
                Err(e) => tracing::debug!(error = %e, "Cannot read the versions waited for; trying again later."),
            }
            if !watched.again {
                watched.reading = false;
                return;
            }
        }
    }

    /// Reads again the checkpoints of every partition waited on, and the versions of every
    /// aggregate waited on; forgets what no one waits on any more.
    async fn poll(self: &Arc<Self>) {
        let keys: Vec<Partition> = {
            let mut offsets = self.offsets.lock().expect("offsets lock");
            offsets.retain(|_, followed| followed.prune());
            offsets.keys().cloned().collect()
        };
        for key in keys {
            match read_offset(&self.pool, &key).await {
                Ok(next) => self.seen_offset(&key, next),
                Err(e) => {
                    tracing::debug!(error = %e, "Cannot read the checkpoints for the waits; trying again.");
                    break;
                }
            }
        }
        let projections: Vec<String> = {
            let mut versions = self.versions.lock().expect("versions lock");
            versions.retain(|_, watched| watched.reading || watched.prune());
            versions.keys().cloned().collect()
        };
        for projection in projections {
            self.moved(&projection);
        }
    }

    fn busy(&self) -> bool {
        !self.offsets.lock().expect("offsets lock").is_empty()
            || !self.versions.lock().expect("versions lock").is_empty()
    }
}

/// A connection of `pool` listening for checkpoint notifications.
async fn connect_listener(pool: &PgPool) -> sqlx::Result<PgListener> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.listen(CHANNEL).await?;
    Ok(listener)
}

/// The listening task, from `listener` (listening already, or `None`): wakes waits on each
/// notification; when the listening connection is lost, connects again (every
/// [`RECONNECT`] until it can) and then reads the checkpoints again, for what was committed
/// meanwhile; and reads them every `poll` while anyone waits.
async fn listen(pool: PgPool, listener: Option<PgListener>, inner: std::sync::Weak<Inner>, poll: Duration) {
    let mut listener = listener;
    let mut tick = tokio::time::interval(poll);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let Some(l) = listener.as_mut() else {
            let connected = connect_listener(&pool).await;
            let Some(inner) = inner.upgrade() else { return };
            match connected {
                Ok(l) => {
                    listener = Some(l);
                    // Anything committed while not listening.
                    inner.poll().await;
                }
                Err(e) => {
                    tracing::debug!(error = %e, "Cannot listen for checkpoints; trying again.");
                    drop(inner);
                    tokio::time::sleep(RECONNECT).await;
                }
            }
            continue;
        };
        let received = tokio::select! {
            received = l.try_recv() => Some(received),
            _ = tick.tick() => None,
        };
        let Some(inner) = inner.upgrade() else { return };
        match received {
            Some(Ok(Some(notification))) => match serde_json::from_str::<Notified>(notification.payload()) {
                Ok(n) if n.schema == inner.schema => {
                    let key = (n.projection.clone(), n.topic, n.partition);
                    // What the checkpoint passed, known before the waits it reaches wake.
                    if let (Some(from), Some(kept_out)) = (n.from, &n.kept_out) {
                        inner.passed(&key, from, n.next_offset, kept_out);
                    }
                    inner.seen_offset(&key, Some(n.next_offset));
                    inner.moved(&n.projection);
                }
                Ok(_) => {}
                Err(e) => tracing::debug!(error = %e, "A checkpoint notification that does not parse; ignored."),
            },
            // The connection was lost (what was sent meanwhile is lost with it), or failed:
            // connected again above, then the checkpoints read.
            Some(Ok(None)) => listener = None,
            Some(Err(e)) => {
                tracing::debug!(error = %e, "Listening for checkpoints failed; reconnecting.");
                listener = None;
            }
            None if inner.busy() => inner.poll().await,
            None => {}
        }
    }
}

async fn read_offset(pool: &PgPool, (projection, topic, partition): &Partition) -> Result<Option<i64>> {
    Ok(sqlx::query_scalar(
        "SELECT next_offset FROM projectionist_checkpoints WHERE projection = $1 AND topic = $2 AND partition = $3",
    )
    .bind(projection)
    .bind(topic)
    .bind(partition)
    .fetch_optional(pool)
    .await?)
}

#[cfg(test)]
mod tests;

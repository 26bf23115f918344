//! Applying one batch: decoded and projected once, then put into the partition's sink
//! (written in one PostgreSQL transaction with its checkpoint, or a rebuild's fold; see
//! [`super::sink`]) — PostgreSQL outages waited out, other transient failures retried a
//! bounded number of times, and what retrying cannot fix halting the partition at the event
//! at fault after committing what precedes it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use projectionist_core::{OnUnknownType, Outcome, OutcomeCounts};
use projectionist_postgres::park::Source;
use projectionist_postgres::writer;
use projectionist_postgres::{EventErrorKind, Prepared, Written};
use tokio::sync::watch;
use tracing::Instrument;

use super::decode::{in_scope, split, At, Msg, Split};
use super::{Halt, HaltKind, Order, Partition};
use crate::metrics as m;
use crate::outage::Outage;
use crate::retry::Retry;

impl Partition {
    /// Applies one batch, waiting out PostgreSQL outages for as long as they last and
    /// retrying other transient failures a bounded number of times; a gap, a poison event
    /// or a failure retrying does not cure halts at that event after applying (and
    /// committing) what precedes it. `through`: the position after the batch when it holds
    /// everything read (its checkpoint then also covers the transaction markers that
    /// followed it). Once `stop` says stop, a wait between attempts ends and the batch is
    /// abandoned (nothing of it committed): a revoked partition's next owner, or the next
    /// run, reads it again from the checkpoint, and a shutdown need not outlast an outage.
    pub(super) async fn apply(
        self: Arc<Self>,
        messages: Vec<Msg>,
        through: Option<i64>,
        order: watch::Receiver<Order>,
    ) -> Applied {
        // OpenTelemetry's messaging conventions (a consumer's "process" span over a batch),
        // and the batch's outcome counts once it commits.
        let span = tracing::info_span!(
            "batch",
            otel.name = %format_args!("process {}", self.tp.topic),
            otel.kind = "consumer",
            messaging.system = "kafka",
            messaging.operation.type = "process",
            messaging.destination.name = %self.tp.topic,
            messaging.destination.partition.id = %self.tp.partition,
            messaging.consumer.group.name = %self.settings.group,
            messaging.batch.message_count = messages.len() as i64,
            projection = %self.name(),
            first_offset = messages.first().map_or(-1, |m| m.at.offset),
            last_offset = messages.last().map_or(-1, |m| m.at.offset),
            applied = tracing::field::Empty,
            duplicate = tracing::field::Empty,
            stale = tracing::field::Empty,
            ignored = tracing::field::Empty,
            parked = tracing::field::Empty,
            dead_letters = tracing::field::Empty,
        );
        crate::trace::link_producers(&span, messages.iter().filter_map(Msg::producer_context));
        let this = self.clone();
        async move {
            let size = messages.len();
            let applied = this.apply_inner(messages, through, order).await;
            if let Applied::Halted(halt) | Applied::Committed { halt: Some(halt), .. } = &applied {
                crate::trace::halted(halt.offset, &halt.aggregate, halt.kind.label(), &halt.reason);
            }
            if !matches!(applied, Applied::Committed { .. }) {
                // Nothing of it committed: read again by the next owner or run.
                this.tally.unapplied(size);
            }
            applied
        }
        .instrument(span)
        .await
    }

    /// [`Partition::apply`]'s work, in its span.
    async fn apply_inner(&self, messages: Vec<Msg>, through: Option<i64>, order: watch::Receiver<Order>) -> Applied {
        let offsets: Vec<i64> = messages.iter().map(|m| m.at.offset).collect();
        let first_offset = messages.first().map_or(0, |m| m.at.offset);
        let last_offset = messages.last().map_or(0, |m| m.at.offset);
        let Some(messages) = self.with_schemas(messages, order.clone()).await else {
            return Applied::Abandoned;
        };
        let (messages, passed_over) = in_scope(messages, &self.settings.scope);
        let (mut prepared, places, mut halt) = self.prepare(messages).await;
        let mut end = prepared.len();
        if let Some((index, failure)) = prepared.failures().find(|(_, e)| self.halts(e)) {
            halt = Some(self.halt_at(places.get(index).copied(), &prepared, index, failure));
            end = index;
        }
        loop {
            prepared.truncate(end);
            // Everything, or up to the message the partition halts at.
            let next_offset = match (&halt, through) {
                (Some(h), _) => h.offset,
                (None, Some(position)) => position.max(last_offset + 1),
                (None, None) => last_offset + 1,
            };
            let mut not_events = 0;
            if let Some(source) = prepared.source_mut() {
                source.undecodable.retain(|u| u.message.offset.is_some_and(|o| o < next_offset));
                not_events = source.undecodable.len() as u64;
            }
            if next_offset <= first_offset {
                break;
            }
            let started = Instant::now();
            let Some(result) = self.attempt(&prepared, &places, next_offset, order.clone()).await else {
                return Applied::Abandoned;
            };
            let e = match result {
                Ok(counted) => {
                    let unapplied = offsets.iter().filter(|&&o| o >= counted.next_offset).count();
                    self.tally.add(&counted.own, not_events);
                    self.tally.unapplied(unapplied);
                    self.tally.other_aggregates(passed_over.iter().filter(|&&o| o < counted.next_offset).count());
                    return self.committed_batch(counted, &prepared, &places, first_offset, started, halt);
                }
                Err(projectionist_postgres::Error::CheckpointMoved { stored, .. }) => return Applied::Moved(stored),
                Err(e) => e,
            };
            let index = e.event_index().unwrap_or(0);
            let e = match e.event_index() {
                Some(_) if !self.halts(&e) => {
                    // An event retrying cannot fix: dead-lettered, the rest written again.
                    let error = e.to_string();
                    match prepared.poison(index, e) {
                        Ok(()) => {
                            tracing::warn!(%error, "An event the batch cannot apply; dead-lettering it.");
                            continue;
                        }
                        Err(e) => e,
                    }
                }
                _ => e,
            };
            halt = Some(self.halt_at(places.get(index).copied(), &prepared, index, &e));
            end = index;
        }
        Applied::Halted(halt.expect("a batch commits, or halts at an event"))
    }

    /// The batch's messages split (those that are not envelopes set aside, or under
    /// `on_poison = halt` a halt at the first) and its envelopes decoded and projected once:
    /// a retry writes the same prepared events again. Where each message was read, and the
    /// halt, if any.
    async fn prepare(&self, messages: Vec<Msg>) -> (Prepared, Vec<At>, Option<Halt>) {
        let Split { places, envelopes, messages, undecodable, halt } = split(messages, self.settings.on_poison);
        let mut prepared = self.projection.prepare_lazy(envelopes);
        let (topic, partition) = (self.tp.topic.clone(), self.tp.partition);
        prepared.set_source(Source { topic, partition, messages, undecodable });
        prepared.set_dead_letter_payload_max(self.settings.bounds.dead_letter_payload);
        if let Some(tables) = self.checked.get(&self.pool, self.projection.as_ref()).await {
            prepared.set_checked(tables);
        }
        if self.settings.sole_writer {
            prepared.set_sole_writer();
        }
        // Each attempt's transaction begins holding the swap lock (see `writer::commit_batch`).
        prepared.set_swap_locked();
        (prepared, places, halt)
    }

    /// What halts rather than being dead-lettered (see [`projectionist_postgres::Error::halts`]).
    fn halts(&self, e: &projectionist_postgres::Error) -> bool {
        e.halts(self.settings.on_poison)
    }

    /// Writes `prepared` up to `next_offset`, waiting out PostgreSQL's outages and retrying
    /// other transient failures; `None` once `order` says stop between attempts.
    async fn attempt(
        &self,
        prepared: &Prepared,
        places: &[At],
        next_offset: i64,
        mut order: watch::Receiver<Order>,
    ) -> Option<projectionist_postgres::Result<Counted>> {
        let mut outage = Outage::new(self.stats.clone(), self.name());
        let result = self
            .settings
            .retry
            .run_until(
                || self.try_apply(prepared, places, next_offset),
                |e| Retry::in_pool(e, &self.pool),
                |e, retrying| {
                    if retrying.kind == Retry::Queue {
                        outage.queued(self.pool.options().get_max_connections(), retrying);
                        return;
                    }
                    if retrying.kind == Retry::WaitOut {
                        outage.failed(e, retrying);
                    } else {
                        let delay_ms = retrying.delay.as_millis() as u64;
                        let attempt = retrying.attempt;
                        let message = "Retryable failure; trying the batch again.";
                        tracing::warn!(error = %e, attempt, delay_ms, "{message}");
                    }
                    metrics::counter!(m::BATCH_RETRIES, "projection" => self.name().to_owned()).increment(1);
                },
                async move {
                    let _ = order.wait_for(|o| *o != Order::Run).await;
                },
            )
            .await;
        if matches!(result, Some(Ok(_))) {
            outage.over();
        }
        result
    }

    /// A batch committed (from `first_offset`, begun at `started`): counted and measured,
    /// and the partition halted at its gap, if one ended it (else at `halt`, if any).
    fn committed_batch(
        &self,
        counted: Counted,
        prepared: &Prepared,
        places: &[At],
        first_offset: i64,
        started: Instant,
        mut halt: Option<Halt>,
    ) -> Applied {
        let Counted { counts, next_offset, gap, ignored, parking, .. } = counted;
        self.stats.add(&counts);
        self.count_ignored(ignored);
        self.count_parking(&parking);
        let applied = gap.as_ref().map_or(prepared.len(), |(index, _)| *index);
        let last = applied.checked_sub(1).and_then(|i| prepared.occurred_at(i)).map(|t| t.timestamp_millis());
        m::batch_committed(&self.pool, self.name(), &self.tp, applied, last, &counts, started.elapsed());
        if let Some((index, reason)) = gap {
            let m = places[index];
            let aggregate = prepared.aggregate_id(index).unwrap_or("?").to_owned();
            halt = Some(Halt {
                offset: m.offset,
                timestamp: m.timestamp,
                aggregate,
                reason,
                kind: HaltKind::Gap,
                heals: false,
            });
        }
        Applied::Committed { first_offset, next_offset, halt }
    }

    /// Counts a committed batch's ignored events by type, and warns the first time a run
    /// meets a type (unless the projection ignores unknown types on purpose).
    fn count_ignored(&self, ignored: BTreeMap<String, u64>) {
        for (event_type, n) in ignored {
            let (counted_as, new) = self.stats.ignore(&event_type, n);
            m::events_ignored(self.name(), counted_as, n);
            if new && self.projection.on_unknown_type() == OnUnknownType::Warn {
                tracing::warn!(
                    projection = %self.name(),
                    event_type = %event_type,
                    events = n,
                    handled = %self.projection.event_types().join(", "),
                    "Ignoring events of a type the projection does not handle (they still move their aggregates' \
                     versions). If the producer spells a handled type otherwise, fix the name; if the type is \
                     left out on purpose, return OnUnknownType::Ignore from on_unknown_type. Counted in \
                     projectionist_events_ignored_total."
                );
            }
        }
    }

    /// Where a failure that retries did not cure (or that retrying cannot fix) stops the
    /// partition: at the event it names, `message`, the `index`th of `prepared` (without a
    /// place, a problem of the whole batch: at its checkpoint).
    fn halt_at(
        &self,
        message: Option<At>,
        prepared: &Prepared,
        index: usize,
        e: &projectionist_postgres::Error,
    ) -> Halt {
        let (reason, kind) = classify(e, self.settings.retry.max_retries);
        let heals = heals(e);
        let mut aggregate = prepared.aggregate_id(index).unwrap_or("?").to_owned();
        let checkpoint = self.progress.checkpoint.load(std::sync::atomic::Ordering::SeqCst).max(0);
        let mut message = message.unwrap_or(At { offset: checkpoint, timestamp: None });
        // A bound on dead letters names its message, which may be no envelope at all.
        if let projectionist_postgres::Error::DeadLetterBound { offset: Some(offset), aggregate: named, .. } = e {
            if *offset != message.offset {
                message = At { offset: *offset, timestamp: None };
            }
            aggregate = named.clone().unwrap_or_else(|| "-".to_owned());
        }
        Halt { offset: message.offset, timestamp: message.timestamp, aggregate, reason, kind, heals }
    }

    /// One attempt: the prepared batch into the partition's sink with its checkpoint (see
    /// [`Sink`](super::Sink): written in one transaction, or folded). A gap ends the batch:
    /// the events before it commit with a checkpoint at its offset, and it is named.
    async fn try_apply(
        &self,
        prepared: &Prepared,
        at: &[At],
        next_offset: i64,
    ) -> projectionist_postgres::Result<Counted> {
        let writer::Committed { written, next_offset, gap } = self.sink_batch(prepared, at, next_offset).await?;
        Ok(self.committed(prepared, written, next_offset, gap).await)
    }

    /// What a batch whose transaction committed (or whose events were folded) did, counted.
    async fn committed(
        &self,
        prepared: &Prepared,
        written: Written,
        next_offset: i64,
        gap: Option<(usize, String)>,
    ) -> Counted {
        let outcomes = written.outcomes;
        let dead_letters = written.dead_letters;
        if let (Some(topic), false) = (&self.dead_letter_topic, written.dead_letter_ids.is_empty()) {
            topic.send(&self.pool, &written.dead_letter_ids).await;
        }
        if written.per_event {
            metrics::counter!(m::BATCH_FALLBACKS, "projection" => self.name().to_owned()).increment(1);
        }
        let mut counts: OutcomeCounts = outcomes.iter().filter(|o| !matches!(o, Outcome::Gap { .. })).collect();
        let own = counts;
        // Held events of earlier batches applied now count as what they became.
        let drained = written.drained;
        counts.merge(&OutcomeCounts { parked: 0, ..drained });
        let parking = Parking {
            drained: drained.total() - drained.parked,
            parked: written.parked,
            resumed: written.resumed,
            dead_letters: dead_letters.values().sum(),
        };
        let mut ignored = BTreeMap::new();
        for (index, _) in outcomes.iter().enumerate().filter(|(_, o)| **o == Outcome::Ignored) {
            if let Some(event_type) = prepared.ignored_type(index) {
                *ignored.entry(event_type.to_owned()).or_default() += 1;
            }
        }
        for (reason, n) in dead_letters {
            metrics::counter!(m::DEAD_LETTERS, "projection" => self.name().to_owned(), "reason" => reason).increment(n);
        }
        Counted { counts, own, next_offset, gap, ignored, parking }
    }

    /// Counts what a committed batch did to the parking, and logs it.
    fn count_parking(&self, parking: &Parking) {
        let (counts, projection) = (&parking, self.name().to_owned());
        if counts.parked + counts.resumed + counts.drained + counts.dead_letters == 0 {
            return;
        }
        self.stats.drained.fetch_add(counts.drained, std::sync::atomic::Ordering::Relaxed);
        self.stats.dead_letters.fetch_add(counts.dead_letters, std::sync::atomic::Ordering::Relaxed);
        self.stats.parking_changed.store(true, std::sync::atomic::Ordering::Relaxed);
        // As signed integers, which OpenTelemetry keeps as numbers.
        let span = tracing::Span::current();
        span.record("parked", counts.parked as i64).record("dead_letters", counts.dead_letters as i64);
        metrics::counter!(m::EVENTS_DRAINED, "projection" => projection.clone()).increment(counts.drained);
        metrics::counter!(m::AGGREGATES_PARKED, "projection" => projection.clone()).increment(counts.parked);
        metrics::counter!(m::AGGREGATES_RESUMED, "projection" => projection).increment(counts.resumed);
        let (topic, partition) = (&self.tp.topic, self.tp.partition);
        tracing::info!(
            projection = %self.name(),
            %topic,
            partition,
            parked = counts.parked,
            resumed = counts.resumed,
            drained = counts.drained,
            dead_letters = counts.dead_letters,
            "Parking: aggregates parked behind a missing version or a dead letter (their events are held in \
             projectionist_held; `parked` lists them, `dead-letters list` the dead letters), and aggregates resumed \
             as the missing version arrived (their held events applied)."
        );
    }
}

/// A batch's result.
#[derive(Debug)]
pub(crate) enum Applied {
    /// Committed, the checkpoint at `next_offset` (the batch started at `first_offset`);
    /// with `halt`, the partition stops there (nothing at or after it was applied).
    Committed { first_offset: i64, next_offset: i64, halt: Option<Halt> },
    /// Nothing committed: the partition stops at the batch's first event.
    Halted(Halt),
    /// Nothing committed: the partition was stopped while the batch waited to be retried
    /// (its events are read again from the checkpoint).
    Abandoned,
    /// Nothing committed: the checkpoint moved under this process (see
    /// [`Partition::store_checkpoint`]); the partition reads on from where it stands
    /// (`None`: from the start).
    Moved(Option<i64>),
}

/// A batch's committed transaction: its outcomes, the checkpoint it stored, and the gap that
/// ended it, if one did (its index in the batch, and why).
struct Counted {
    counts: OutcomeCounts,
    /// The outcomes of the batch's own events (`counts` without the held events of earlier
    /// batches it applied).
    own: OutcomeCounts,
    /// What the batch did to the parking.
    parking: Parking,
    next_offset: i64,
    gap: Option<(usize, String)>,
    /// Ignored events by type.
    ignored: BTreeMap<String, u64>,
}

/// What a batch did to the parking: aggregates it parked (or moved to wait for another
/// version) and resumed, and held events of earlier batches it applied.
#[derive(Debug, Default)]
struct Parking {
    parked: u64,
    resumed: u64,
    drained: u64,
    /// Dead letters kept (each parks its aggregate, or stands alone).
    dead_letters: u64,
}

/// Whether a failure that halts may go away while the run goes on, so that reading again
/// from the checkpoint may get past it: a permission, a table or column, a constraint, a
/// bound on parking or dead letters, a failing `apply`, a transient failure that outlasted
/// its retries. Not what only a new build can change: an event that does not decode, a type
/// the projection does not handle, one of another release, writes its declarations forbid.
fn heals(e: &projectionist_postgres::Error) -> bool {
    fn needs_a_build(kind: &EventErrorKind) -> bool {
        match kind {
            EventErrorKind::Decode(_)
            | EventErrorKind::UnknownType { .. }
            | EventErrorKind::Release(_)
            | EventErrorKind::Invalid(_) => true,
            EventErrorKind::Held { source, .. } => needs_a_build(&source.kind),
            _ => false,
        }
    }
    !e.event_kind().is_some_and(needs_a_build)
}

/// Whether PostgreSQL refused a statement for naming a table or column that does not exist.
fn is_undefined(e: &sqlx::Error) -> bool {
    let code = e.as_database_error().and_then(|d| d.code());
    code.is_some_and(|c| c == "42703" || c == "42P01")
}

/// Why a failure that retries did not cure stops the partition, and its kind.
fn classify(e: &projectionist_postgres::Error, retries: u32) -> (String, HaltKind) {
    match e.event_kind() {
        Some(EventErrorKind::Decode(source)) => return (source.to_string(), HaltKind::Poison),
        Some(EventErrorKind::UnknownType { event_type, known }) => {
            let reason =
                format!("type {event_type:?} is none the projection handles ({known}), and it halts on such events");
            return (reason, HaltKind::Poison);
        }
        Some(EventErrorKind::Invalid(problem)) => return (problem.clone(), HaltKind::Error),
        _ => {}
    }
    match e {
        other if other.is_retryable() => (format!("{other} (gave up after {retries} retries)"), HaltKind::Error),
        // A table or column of the declarations missing: the tables changed under the run.
        projectionist_postgres::Error::Database(d) if is_undefined(d) => (
            format!(
                "{e}: the projection's tables are not as this build declares them (a rollback restored older \
                 tables, or they were changed by hand); run this build's `migrate` to see how they differ and what \
                 to do (`rebuild`, or `migrate --add-columns`), or run the build that matches them"
            ),
            HaltKind::Error,
        ),
        // A value the database refused, a failing `apply`, ...
        other => (other.to_string(), HaltKind::Error),
    }
}

//! A planned batch in PostgreSQL: the stored versions of every key the batch touches read
//! in bulk (locking the rows), the plan (`projectionist_core::plan`) made in memory, then a
//! few set-based statements per table, each one's row count checked against the plan.
//!
//! Rows travel as one array per column, each value's text cast to the column's declared
//! type, where every value of the row is one that type's text input stores as the JSON path
//! would; otherwise as one JSON array per statement, turned into typed rows by
//! `jsonb_populate_record(NULL::table, …)`, which converts every value to its column's type
//! (see `rows.rs`).

use std::collections::HashMap;
use std::io::Write as _;

use projectionist_core::fold::Fold;
use projectionist_core::plan::{
    aggregate_gated, plan, plan_unordered, rounds, AggregateWrite, Effect, EventRef, Parked, Plan, PlanError, RowKind,
    RowWrite, Stored, Versions,
};
use projectionist_core::{Gate, Outcome, Table};
use serde_json::Value;
use sqlx::{Connection, PgConnection};

mod fold;
mod rows;
mod shape;
mod statements;
mod stored;

pub(crate) use fold::{fold, write_fold};
use statements::{expect_rows, write_row_writes};
use stored::{read_stored, write_aggregates};

use crate::error::Error;
use crate::error::EventErrorKind;
use crate::error::Result;
use crate::tables::checks::Checks;
use crate::tables::ident::Ident;
use crate::tables::types::{PgTypes, TextColumns};
use crate::writing::known::{KnownVersions, Lookup};
use crate::writing::shared_rows::SharedRows;

/// Whether the database refused a statement for a value in it — a data exception (class
/// 22: a value the column type cannot take, an overflow), a constraint (23: NOT NULL, CHECK,
/// unique) or a limit (54: an index entry too large) — so that one event is at fault. Any
/// other refusal (an undefined column, a syntax error) is the same for every event.
fn is_about_a_value(e: &sqlx::Error) -> bool {
    let code = e.as_database_error().and_then(|d| d.code());
    code.is_some_and(|c| c.starts_with("22") || c.starts_with("23") || c.starts_with("54"))
}

/// How many times the per-event path re-plans one event whose rows a concurrent writer moved.
const PER_EVENT_TRIES: usize = 5;

/// How a batch is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Set-based: the batch planned in memory, a few statements per table; event by event
    /// (in the same transaction) when the database refuses a value or a concurrent writer
    /// moved the batch's rows. The default.
    Batch,
    /// One event at a time, each under a savepoint, waiting on concurrent writers' row
    /// locks: what a batch falls back to.
    PerEvent,
}

/// What writing a batch did (see `writer::write`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Written {
    /// One outcome per event, up to and including the first [`Outcome::Gap`] (the batch
    /// ends there: nothing at or after it was written). [`Outcome::Parked`]: held.
    pub outcomes: Vec<Outcome>,
    /// Whether the set-based path gave way to the per-event path (a value the database
    /// refused, or a concurrent writer).
    pub per_event: bool,
    /// The outcomes of events held by earlier batches and applied by this one (their
    /// aggregate's missing version arrived).
    pub drained: projectionist_core::OutcomeCounts,
    /// Aggregates parked by this batch (behind a gap or a dead letter).
    pub parked: u64,
    /// Aggregates resumed by this batch.
    pub resumed: u64,
    /// Dead letters this batch kept: its events that cannot be applied as they stand,
    /// held events found so when their aggregate resumed, and messages that are not an
    /// envelope at all; by reason (`envelope`, `data`, `value`, `apply`, …).
    pub dead_letters: std::collections::BTreeMap<&'static str, u64>,
    /// The ids of those dead letters.
    pub dead_letter_ids: Vec<i64>,
    /// The offsets of the batch's messages that are not in the read model: held behind a
    /// parked aggregate, dead-lettered, or skipped as a discarded dead letter (what the
    /// checkpoint's notification tells the waits: `checkpoint::Passed`).
    pub kept_out: Vec<i64>,
}

/// Parked aggregates by (aggregate type, aggregate id).
pub(crate) type ParkedMap = HashMap<(String, String), Parked>;

/// What a run starts from: the parked aggregates (`None`: parking off), whether a gap still
/// halts (then only dead letters park), and what PostgreSQL checks of the tables.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RunContext<'a> {
    pub parked: Option<&'a ParkedMap>,
    pub gaps_halt: bool,
    /// What PostgreSQL checks of the projection's tables beyond their declarations (see
    /// [`Checks`]).
    pub checked: &'a Checks,
    /// No one else writes the tables (see [`crate::projection::prepared::Prepared::set_sole_writer`]): even the
    /// per-event path reads rows without row locks.
    pub sole_writer: bool,
    /// The run is applied event by event (the per-event path): its reads lock the rows.
    pub per_event: bool,
    /// The fan-in rows the batch writes, locked right before the first of them is written.
    pub shared: &'a SharedRows,
    /// The versions the partition's batches wrote, where it remembers them: read only
    /// where not known, and what the set-based path writes taken in.
    pub known: Option<&'a KnownVersions>,
}

/// What applying a run did.
#[derive(Debug, Default)]
pub(crate) struct Ran {
    /// One outcome per event, up to the first gap (parking off: the outcomes end with it,
    /// and nothing at or after it is written), or up to the event that resumed a parked
    /// aggregate (`unparked`).
    pub outcomes: Vec<Outcome>,
    /// Whether the set-based path gave way to the per-event path.
    pub per_event: bool,
    /// Aggregates parked or resumed by the run, with their state at its end.
    pub parks: Vec<((String, String), Option<Parked>)>,
    /// The run ended after its last outcome's event, which resumed this parked aggregate:
    /// its held events are to be applied next.
    pub unparked: Option<(String, String)>,
}

/// Applies a run of planned events in the caller's transaction, up to its first gap (the
/// outcomes then end with it, and nothing at or after it is written) or, with parking on
/// (`parked` is `Some`: the parked aggregates where the run starts), up to the event that
/// resumes a parked aggregate. Set-based (`Mode::Batch`) after a savepoint: when the
/// database refuses a statement (a value the column cannot take, a constraint), or a
/// statement changes another number of rows than planned (a concurrent writer moved them),
/// the savepoint is rolled back and the run applied again event by event in the same
/// transaction — which names the event at fault, and waits on the concurrent writer's row
/// locks.
pub(crate) async fn apply(
    conn: &mut PgConnection,
    projection: &str,
    tables: &[Table],
    events: &[(EventRef<'_>, Effect<'_>)],
    mode: Mode,
    parking: RunContext<'_>,
) -> Result<Ran> {
    // Rows checked against other rows (a unique index, a foreign key): whether one is
    // refused depends on the order of writes across rows, which only the events' own order
    // keeps.
    let checked = parking.checked;
    if mode == Mode::PerEvent || (!checked.ordered.is_empty() && writes_any(events, |t| checked.is_ordered(t))) {
        return apply_per_event(conn, projection, tables, events, parking).await;
    }
    // Released with the transaction (a `RELEASE` would cost a round trip per batch); a
    // later run's savepoint of the same name hides it, and a rollback goes to the latest.
    sqlx::query("SAVEPOINT projectionist_set_based").execute(&mut *conn).await?;
    match apply_set_based(conn, projection, tables, events, parking).await {
        Ok(ran) => Ok(ran),
        Err(e) if matches!(&e, Error::Conflict { .. }) || matches!(&e, Error::Database(d) if is_about_a_value(d)) => {
            sqlx::query("ROLLBACK TO SAVEPOINT projectionist_set_based").execute(&mut *conn).await?;
            tracing::info!(
                projection,
                reason = %e,
                "The set-based statements could not apply the batch; applying its events one by one."
            );
            apply_per_event(conn, projection, tables, events, parking).await
        }
        Err(e) => Err(e),
    }
}

async fn apply_set_based(
    conn: &mut PgConnection,
    projection: &str,
    tables: &[Table],
    events: &[(EventRef<'_>, Effect<'_>)],
    parking: RunContext<'_>,
) -> Result<Ran> {
    if events.is_empty() {
        return Ok(Ran::default());
    }
    let plan = plan_run(conn, projection, tables, events, parking).await?;
    // Where coalescing a row's writes would keep a state from PostgreSQL's checks (a table
    // with CHECK constraints, a value that might be refused written over), rounds.
    let mut in_rounds = plan.superseded.clone();
    in_rounds.extend(plan.rewritten.iter().filter(|t| parking.checked.in_rounds(t)).copied());
    let cuts = if in_rounds.is_empty() { Vec::new() } else { rounds(events, &in_rounds) };
    if !cuts.is_empty() {
        return apply_rounds(conn, projection, tables, events, parking, &cuts).await;
    }
    write_plan(conn, projection, plan, parking).await
}

/// The plan of a run of events, against the rows as they are now.
async fn plan_run<'a>(
    conn: &mut PgConnection,
    projection: &str,
    tables: &[Table],
    events: &'a [(EventRef<'a>, Effect<'a>)],
    parking: RunContext<'_>,
) -> Result<Plan<'a>> {
    let lock = parking.per_event && !parking.sole_writer;
    let mut plan = plan_against(conn, projection, tables, events, lock, parking, parking.known).await?;
    // A gap planned against a version the partition remembers may be a row an operator's
    // command moved on since (a discard, a retry, a skip): planned again against the table.
    // Only the waiting aggregates' versions are forgotten, and only where one was remembered.
    if let Some(known) = parking.known.filter(|_| !lock) {
        if known.distrust(waiting(&plan, events)) {
            plan = plan_against(conn, projection, tables, events, lock, parking, Some(known)).await?;
        }
    }
    Ok(plan)
}

/// The aggregates `plan` waits for a version of: the one whose gap ends it, and those it
/// parks on a gap (not those parked behind a dead letter: their event is there).
fn waiting<'a>(plan: &Plan<'_>, events: &'a [(EventRef<'a>, Effect<'a>)]) -> Vec<&'a str> {
    let parked = plan.parks.iter().filter(|(_, p)| p.is_some_and(|p| !p.dead_letter));
    let gap = ends_in_a_gap(&plan.outcomes).then(|| plan.outcomes.len() - 1).and_then(|i| events.get(i));
    let mut ids: Vec<&'a str> = gap.map(|(e, _)| e.aggregate_id).into_iter().collect();
    for ((_, id), _) in parked {
        if let Some((e, _)) = events.iter().find(|(e, _)| e.aggregate_id == id) {
            ids.push(e.aggregate_id);
        }
    }
    ids
}

/// The plan of a run of events against the rows as they are now (as far as `known` does
/// not say), up to its first gap.
async fn plan_against<'a>(
    conn: &mut PgConnection,
    projection: &str,
    tables: &[Table],
    events: &'a [(EventRef<'a>, Effect<'a>)],
    lock: bool,
    parking: RunContext<'_>,
    known: Option<&KnownVersions>,
) -> Result<Plan<'a>> {
    let mut stored = read_stored(conn, projection, tables, events, lock, None, known).await?;
    stored.parked = parking.parked.cloned();
    stored.gaps_halt = parking.gaps_halt;
    let planned = |events| planned(events, plan(tables, &PgTypes, &stored, events));
    let mut plan = planned(events)?;
    // A gap ends the run: what precedes it is written, nothing at or after it.
    if let Some(gap) = plan.outcomes.iter().position(|o| matches!(o, Outcome::Gap { .. })) {
        let outcome = plan.outcomes[gap];
        plan = planned(&events[..gap])?;
        plan.outcomes.push(outcome);
    }
    Ok(plan)
}

/// Writes `plan`: the aggregates' versions and rows first, then, the shared rows locked,
/// the fan-in rows (see [`SharedRows`]).
async fn write_plan(conn: &mut PgConnection, projection: &str, plan: Plan<'_>, parking: RunContext<'_>) -> Result<Ran> {
    write_aggregates(conn, projection, &plan.aggregates).await?;
    let (fan_in, own): (Vec<&RowWrite<'_>>, Vec<&RowWrite<'_>>) =
        plan.rows.iter().partition(|r| r.table.gate() == Gate::FanIn);
    write_row_writes(conn, own).await?;
    if !fan_in.is_empty() {
        parking.shared.lock(conn).await?;
        write_row_writes(conn, fan_in).await?;
    }
    if let Some(known) = parking.known {
        known.wrote(&plan.rows);
    }
    Ok(Ran { outcomes: plan.outcomes, per_event: false, parks: plan.parks, unparked: plan.unparked })
}

/// Whether any event of `events` writes a table `matches` picks.
fn writes_any(events: &[(EventRef<'_>, Effect<'_>)], matches: impl Fn(&Table) -> bool) -> bool {
    events.iter().any(|(_, effect)| matches!(effect, Effect::Writes(w) if w.iter().any(|w| matches(w.table()))))
}

/// A run whose rows of checked tables are written more than once, written in rounds (see
/// [`rounds`]): each round planned against what the rounds before it wrote, so that every
/// state a checked row goes through meets its constraints, as one event at a time would.
async fn apply_rounds(
    conn: &mut PgConnection,
    projection: &str,
    tables: &[Table],
    events: &[(EventRef<'_>, Effect<'_>)],
    parking: RunContext<'_>,
    cuts: &[usize],
) -> Result<Ran> {
    let mut runs = Runs::new(parking, false);
    let bounds: Vec<usize> = std::iter::once(0).chain(cuts.iter().copied()).chain([events.len()]).collect();
    for round in bounds.windows(2) {
        let (start, end) = (round[0], round[1]);
        let plan = plan_run(conn, projection, tables, &events[start..end], runs.parking()).await;
        let one = write_plan(conn, projection, plan.map_err(|e| e.shifted(start))?, runs.parking()).await?;
        // A round that ends in a gap, or with an aggregate resumed, ends the batch.
        if runs.take(one) {
            break;
        }
    }
    Ok(runs.finish())
}

/// Runs of a batch applied one after another, each seeing what those before it wrote and
/// parked.
struct Runs<'a> {
    ran: Ran,
    parked: Option<ParkedMap>,
    parks: HashMap<(String, String), Option<Parked>>,
    gaps_halt: bool,
    checked: Checks,
    sole_writer: bool,
    shared: &'a SharedRows,
    known: Option<&'a KnownVersions>,
}

impl<'a> Runs<'a> {
    fn new(parking: RunContext<'a>, per_event: bool) -> Self {
        let ran = Ran { per_event, ..Ran::default() };
        let (parked, gaps_halt, checked) = (parking.parked.cloned(), parking.gaps_halt, parking.checked.clone());
        let (sole_writer, shared, known) = (parking.sole_writer, parking.shared, parking.known);
        Self { ran, parked, parks: HashMap::new(), gaps_halt, checked, sole_writer, shared, known }
    }

    /// The parking state as the next run finds it.
    fn parking(&self) -> RunContext<'_> {
        RunContext {
            parked: self.parked.as_ref(),
            gaps_halt: self.gaps_halt,
            checked: &self.checked,
            sole_writer: self.sole_writer,
            per_event: self.ran.per_event,
            shared: self.shared,
            known: self.known,
        }
    }

    /// Takes a run's outcomes and parks; `true` when the batch ends with it (a gap, or an
    /// aggregate resumed: its held events come next).
    fn take(&mut self, one: Ran) -> bool {
        self.ran.outcomes.extend(one.outcomes);
        for (aggregate, state) in one.parks {
            if let Some(parked) = self.parked.as_mut() {
                match state {
                    Some(p) => parked.insert(aggregate.clone(), p),
                    None => parked.remove(&aggregate),
                };
            }
            self.parks.insert(aggregate, state);
        }
        self.ran.unparked = one.unparked;
        ends_in_a_gap(&self.ran.outcomes) || self.ran.unparked.is_some()
    }

    fn finish(mut self) -> Ran {
        self.ran.parks = sorted(self.parks);
        self.ran
    }
}

/// The plan of `events`, or the error naming the event that cannot be planned.
fn planned<'a>(
    events: &[(EventRef<'_>, Effect<'_>)],
    plan: std::result::Result<Plan<'a>, PlanError>,
) -> Result<Plan<'a>> {
    plan.map_err(|e| {
        let event = &events[e.index].0;
        if e.disagreement {
            Error::Conflict { detail: format!("{} v{}: {}", aggregate(event), event.version, e.problem) }
        } else {
            let of = (event.aggregate_type, event.aggregate_id);
            Error::event(e.index, of, event.version, EventErrorKind::Invalid(e.problem))
        }
    })
}

/// Whether the last outcome is a gap: the run stopped there.
pub(crate) fn ends_in_a_gap(outcomes: &[Outcome]) -> bool {
    matches!(outcomes.last(), Some(Outcome::Gap { .. }))
}

/// `type/id`, as errors name an aggregate.
pub(crate) fn aggregate(event: &EventRef<'_>) -> String {
    format!("{}/{}", event.aggregate_type, event.aggregate_id)
}

/// The per-event path: each event planned and written alone under a savepoint, re-planned
/// when a concurrent writer moved its rows (its statements then wait on that writer's row
/// locks and see its commit). Slower, and exact under any concurrency. A statement the
/// database refuses is [`EventErrorKind::Rejected`](crate::error::EventErrorKind::Rejected), naming the event.
async fn apply_per_event(
    conn: &mut PgConnection,
    projection: &str,
    tables: &[Table],
    events: &[(EventRef<'_>, Effect<'_>)],
    parking: RunContext<'_>,
) -> Result<Ran> {
    // Event by event, what is known is neither looked up nor taken in (reads lock the rows).
    if let Some(known) = parking.known {
        known.off();
    }
    let mut runs = Runs::new(parking, true);
    for (index, event) in events.iter().enumerate() {
        let mut tries = 0;
        loop {
            let mut savepoint = conn.begin().await?;
            let one = std::slice::from_ref(event);
            match apply_set_based(&mut savepoint, projection, tables, one, runs.parking()).await {
                Ok(one) => {
                    savepoint.commit().await?;
                    if runs.take(one) {
                        return Ok(runs.finish());
                    }
                    break;
                }
                Err(Error::Conflict { detail }) => {
                    savepoint.rollback().await?;
                    tries += 1;
                    if tries == PER_EVENT_TRIES {
                        // Not a race any more: the tables disagree with each other for good.
                        let (e, _) = event;
                        let problem = format!("{detail} (still after {tries} tries)");
                        let of = (e.aggregate_type, e.aggregate_id);
                        return Err(Error::event(index, of, e.version, EventErrorKind::Invalid(problem)));
                    }
                }
                Err(e) => return Err(e.of_event(index, &event.0)),
            }
        }
    }
    Ok(runs.finish())
}

fn sorted(parks: HashMap<(String, String), Option<Parked>>) -> Vec<((String, String), Option<Parked>)> {
    let mut parks: Vec<_> = parks.into_iter().collect();
    parks.sort_unstable_by(|(a, _), (b, _)| a.cmp(b));
    parks
}

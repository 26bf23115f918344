//! A planned batch in PostgreSQL: the stored versions of every key the batch touches read
//! in bulk (locking the rows), the plan (`projectionist_core::plan`) made in memory, then a
//! few set-based statements per table, each one's row count checked against the plan.
//!
//! Rows travel as one JSON array per statement and are turned into typed rows by
//! `jsonb_populate_record(NULL::table, …)`, so PostgreSQL converts every value to its
//! column's declared type and the engine needs no type mapping of its own.

use std::collections::HashMap;
use std::io::Write as _;

use projectionist_core::fold::Fold;
use projectionist_core::plan::{
    aggregate_gated, plan, plan_unordered, rounds, AggregateWrite, CopyColumns, Effect, EventRef, Parked, Plan,
    PlanError, RowKind, RowWrite, Stored, Versions,
};
use projectionist_core::{Gate, Outcome, Table};
use serde::Serialize;
use serde_json::Value;
use sqlx::{Connection, PgConnection};

use crate::checks::Checks;
use crate::shared_rows::SharedRows;
use crate::{Error, Ident, Mode, Result};

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
    /// No one else writes the tables (see [`crate::Prepared::set_sole_writer`]): rows are
    /// read without row locks.
    pub sole_writer: bool,
    /// The fan-in rows the batch writes, locked right before the first of them is written.
    pub shared: &'a SharedRows,
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
    write_plan(conn, projection, plan, parking.shared).await
}

/// The plan of a run of events, against the rows as they are now.
async fn plan_run<'a>(
    conn: &mut PgConnection,
    projection: &str,
    tables: &[Table],
    events: &'a [(EventRef<'a>, Effect<'a>)],
    parking: RunContext<'_>,
) -> Result<Plan<'a>> {
    let mut stored = read_stored(conn, projection, tables, events, parking.sole_writer, None).await?;
    stored.parked = parking.parked.cloned();
    stored.gaps_halt = parking.gaps_halt;
    let planned = |events| planned(events, plan(tables, &stored, events));
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
async fn write_plan(conn: &mut PgConnection, projection: &str, plan: Plan<'_>, shared: &SharedRows) -> Result<Ran> {
    write_aggregates(conn, projection, &plan.aggregates).await?;
    let (fan_in, own): (Vec<&RowWrite<'_>>, Vec<&RowWrite<'_>>) =
        plan.rows.iter().partition(|r| r.table.gate() == Gate::FanIn);
    write_row_writes(conn, own).await?;
    if !fan_in.is_empty() {
        shared.lock(conn).await?;
        write_row_writes(conn, fan_in).await?;
    }
    Ok(Ran { outcomes: plan.outcomes, per_event: false, parks: plan.parks, unparked: plan.unparked })
}

/// Plans `events` against the rows as the table and `fold` hold them, and folds the plan
/// into `fold` without writing anything: the outcomes, or `None` when the plan cannot be
/// folded (see [`Fold::absorb`]; `fold` is then unchanged), as when an event is of one of
/// the `parked` aggregates (held: the batch is written as usual).
pub(crate) async fn fold(
    conn: &mut PgConnection,
    projection: &str,
    tables: &[Table],
    events: &[(EventRef<'_>, Effect<'_>)],
    parked: &ParkedMap,
    fold: &mut Fold,
) -> Result<Option<Vec<Outcome>>> {
    let of_parked = |e: &EventRef<'_>| parked.contains_key(&(e.aggregate_type.to_owned(), e.aggregate_id.to_owned()));
    if !parked.is_empty() && events.iter().any(|(e, _)| of_parked(e)) {
        return Ok(None);
    }
    let stored = read_stored(conn, projection, tables, events, true, Some(fold)).await?;
    // Folded, the rows are written in the fold's order, not the plan's.
    let plan = planned(events, plan_unordered(tables, &stored, events))?;
    Ok(fold.absorb(tables, &plan).then_some(plan.outcomes))
}

/// Writes what `fold` holds, set-based, each statement's row count checked: the aggregates'
/// versions, then its rows 10,000 at a time (see [`Fold::rows`]), so that their statements'
/// text stays small beside the fold. The rows it creates go in by `COPY` where their values
/// allow (see [`copy_rows`]), table by table, after the table's checks and deletes and
/// before its other writes. Its fan-in rows are locked with those of `then` (the batch
/// written next in the transaction) right before the first is written.
pub(crate) async fn write_fold(
    conn: &mut PgConnection,
    projection: &str,
    tables: &[Table],
    fold: &Fold,
    then: SharedRows,
) -> Result<()> {
    write_aggregates(conn, projection, &fold.aggregates()).await?;
    let copy: Vec<CopyColumns> = tables.iter().map(CopyColumns::of).collect();
    let shared = SharedRows::of_rows(fold.fan_in_rows(tables)).with(then);
    let mut locked = false;
    for rows in fold.rows(tables, 10_000) {
        // The chunk holds each table's rows together, in `tables`' order.
        let mut rest = rows.as_slice();
        while let Some(first) = rest.first() {
            let n = rest.iter().take_while(|r| r.table.name() == first.table.name()).count();
            let (of_table, after) = rest.split_at(n);
            rest = after;
            if first.table.gate() == Gate::FanIn && !locked {
                shared.lock(conn).await?;
                locked = true;
            }
            let columns = tables.iter().position(|t| t.name() == first.table.name()).map(|i| &copy[i]);
            // Sorted by kind: the checks, clears and deletes before the rows copied in.
            let removing = of_table.iter().take_while(|r| r.kind < RowKind::Insert).count();
            let (removed, of_table) = of_table.split_at(removing);
            write_row_writes(conn, removed).await?;
            let (copied, written): (Vec<&RowWrite<'_>>, Vec<&RowWrite<'_>>) =
                of_table.iter().partition(|r| columns.is_some_and(|c| copyable(c, r)));
            copy_rows(conn, &copied).await?;
            write_row_writes(conn, written).await?;
        }
    }
    Ok(())
}

/// Whether `row` is a new row whose every value `COPY` stores as the JSON path would: an
/// insert into a gated table (it carries a version), each column set to a value
/// [`CopyColumns::takes`].
fn copyable(columns: &CopyColumns, row: &RowWrite<'_>) -> bool {
    row.kind == RowKind::Insert
        && row.version.is_some()
        && row.columns.iter().all(|c| c.deltas.is_empty() && c.base.is_some_and(|v| columns.takes(c.column, v)))
}

/// Writes new rows of one table by `COPY … FROM STDIN` (text format), one statement per set
/// of columns, each one's row count checked: a bulk load's rows, which no one else writes
/// (the rows a fold creates were found in no table), with no conflict to resolve. For
/// PostgreSQL, reading their text costs a fraction of parsing them as one JSON array.
async fn copy_rows(conn: &mut PgConnection, rows: &[&RowWrite<'_>]) -> Result<()> {
    let mut shapes: Vec<(Vec<&'static str>, Vec<u8>, usize)> = Vec::new();
    for row in rows {
        let columns = || row.columns.iter().map(|c| c.column);
        let i = match shapes.iter().position(|(c, ..)| c.iter().copied().eq(columns())) {
            Some(i) => i,
            None => {
                shapes.push((columns().collect(), Vec::new(), 0));
                shapes.len() - 1
            }
        };
        let (_, text, count) = &mut shapes[i];
        copy_field(text, row.key);
        for c in &row.columns {
            text.push(b'\t');
            match c.base {
                Some(Value::String(s)) => copy_field(text, s),
                Some(Value::Null) | None => text.extend_from_slice(b"\\N"),
                Some(v) => write!(text, "{v}").expect("writing to a Vec"),
            }
        }
        writeln!(text, "\t{}", row.version.unwrap_or_default()).expect("writing to a Vec");
        *count += 1;
    }
    let Some(table) = rows.first().map(|r| r.table) else { return Ok(()) };
    let (name, key, version) = (Ident::new(table.name())?, Ident::new(table.key())?, Ident::new(table.version())?);
    for (columns, text, count) in shapes {
        let mut names = vec![key.to_string()];
        for c in columns {
            names.push(Ident::new(c)?.to_string());
        }
        names.push(version.to_string());
        let mut copy = conn.copy_in_raw(&format!("COPY {name} ({}) FROM STDIN", names.join(", "))).await?;
        copy.send(text).await?;
        let copied = copy.finish().await?;
        expect_rows(table.name(), count, copied)?;
    }
    Ok(())
}

/// `s` as a field of `COPY`'s text format: its backslashes and the characters that end a
/// field or a row escaped.
fn copy_field(out: &mut Vec<u8>, s: &str) {
    for b in s.bytes() {
        match b {
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'\t' => out.extend_from_slice(b"\\t"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b => out.push(b),
        }
    }
}

/// Writes `rows`, one statement per table and shape, each statement's row count checked.
async fn write_row_writes<'r, 'a: 'r>(
    conn: &mut PgConnection,
    rows: impl IntoIterator<Item = &'r RowWrite<'a>>,
) -> Result<()> {
    for (table, shape, rows) in group(rows) {
        write_rows(conn, table, &shape, rows).await?;
    }
    Ok(())
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
        let one = write_plan(conn, projection, plan.map_err(|e| e.shifted(start))?, parking.shared).await?;
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
}

impl<'a> Runs<'a> {
    fn new(parking: RunContext<'a>, per_event: bool) -> Self {
        let ran = Ran { per_event, ..Ran::default() };
        let (parked, gaps_halt, checked) = (parking.parked.cloned(), parking.gaps_halt, parking.checked.clone());
        let (sole_writer, shared) = (parking.sole_writer, parking.shared);
        Self { ran, parked, parks: HashMap::new(), gaps_halt, checked, sole_writer, shared }
    }

    /// The parking state as the next run finds it.
    fn parking(&self) -> RunContext<'_> {
        RunContext {
            parked: self.parked.as_ref(),
            gaps_halt: self.gaps_halt,
            checked: &self.checked,
            sole_writer: self.sole_writer,
            shared: self.shared,
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
            Error::Invalid { index: e.index, aggregate: aggregate(event), version: event.version, problem: e.problem }
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
/// database refuses is [`Error::Rejected`], naming the event.
async fn apply_per_event(
    conn: &mut PgConnection,
    projection: &str,
    tables: &[Table],
    events: &[(EventRef<'_>, Effect<'_>)],
    parking: RunContext<'_>,
) -> Result<Ran> {
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
                        return Err(Error::Invalid {
                            index,
                            aggregate: aggregate(e),
                            version: e.version,
                            problem: format!("{detail} (still after {tries} tries)"),
                        });
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

async fn read_stored(
    conn: &mut PgConnection,
    projection: &str,
    tables: &[Table],
    events: &[(EventRef<'_>, Effect<'_>)],
    sole_writer: bool,
    fold: Option<&Fold>,
) -> Result<Stored> {
    let mut stored = Stored::default();
    // Locked, so that a concurrent writer of the same rows waits (or is waited for) rather
    // than making the batch fall back; a sole writer has none to wait for.
    let lock = if sole_writer { "" } else { " FOR UPDATE" };
    for table in tables.iter().filter(|t| t.is_gated()) {
        let mut ids: Vec<&str> =
            events.iter().filter(|(e, _)| table.owns(e.aggregate_type)).map(|(e, _)| e.aggregate_id).collect();
        // Rows a fold holds are at the version it says; the others, as the table says. (Asked
        // of the fold first: most keys of a rebuild's batch are there, and only the rest are
        // sorted for the query.)
        let mut folded = Versions::default();
        if let Some(fold) = fold {
            ids.retain(|id| {
                if folded.contains_key(*id) {
                    return false;
                }
                match fold.version(table.name(), id) {
                    Some(Some(v)) => {
                        folded.insert((*id).to_owned(), v);
                        false
                    }
                    // Deleted by the fold: no row, whatever the table holds.
                    Some(None) => false,
                    None => true,
                }
            });
        }
        ids.sort_unstable();
        ids.dedup();
        if ids.is_empty() || fold.is_some_and(Fold::knows_all) {
            stored.rows.insert(table.name(), folded);
            continue;
        }
        let (name, key, version) = (Ident::new(table.name())?, Ident::new(table.key())?, Ident::new(table.version())?);
        // Sorted, so two writers lock overlapping rows in the same order.
        let sql = format!("SELECT {key}, {version} FROM {name} WHERE {key} = ANY($1) ORDER BY {key}{lock}");
        let found: Vec<(String, i64)> = sqlx::query_as(&sql).bind(&ids).fetch_all(&mut *conn).await?;
        folded.extend(found);
        stored.rows.insert(table.name(), folded);
    }
    let mut aggregates: Vec<(&str, &str)> = events
        .iter()
        .filter(|(e, _)| aggregate_gated(tables, e.aggregate_type))
        .map(|(e, _)| (e.aggregate_type, e.aggregate_id))
        .collect();
    // Versions a fold moves, as it says; the others, as the table says.
    if let Some(fold) = fold {
        aggregates.retain(|&(t, i)| match fold.aggregate(t, i) {
            Some(v) => {
                stored.aggregates.insert((t.to_owned(), i.to_owned()), v);
                false
            }
            None => true,
        });
    }
    if !aggregates.is_empty() && !fold.is_some_and(Fold::knows_all) {
        aggregates.sort_unstable();
        aggregates.dedup();
        let (types, ids): (Vec<&str>, Vec<&str>) = aggregates.into_iter().unzip();
        let sql = format!(
            "SELECT aggregate_type, aggregate_id, version FROM projectionist_aggregate_versions \
             WHERE projection = $1 AND (aggregate_type, aggregate_id) IN (SELECT * FROM unnest($2::text[], \
             $3::text[])) \
             ORDER BY aggregate_type, aggregate_id{lock}"
        );
        let found: Vec<(String, String, i64)> =
            sqlx::query_as(&sql).bind(projection).bind(&types).bind(&ids).fetch_all(&mut *conn).await?;
        stored.aggregates.extend(found.into_iter().map(|(t, i, v)| ((t, i), v)));
    }
    Ok(stored)
}

async fn write_aggregates(conn: &mut PgConnection, projection: &str, marks: &[AggregateWrite]) -> Result<()> {
    let (inserts, updates): (Vec<&AggregateWrite>, Vec<&AggregateWrite>) =
        marks.iter().partition(|m| m.expected.is_none());
    if !inserts.is_empty() {
        let result = sqlx::query(
            "INSERT INTO projectionist_aggregate_versions (projection, aggregate_type, aggregate_id, version) \
             SELECT $1, * FROM unnest($2::text[], $3::text[], $4::bigint[]) ON CONFLICT DO NOTHING",
        )
        .bind(projection)
        .bind(inserts.iter().map(|m| m.aggregate_type.as_str()).collect::<Vec<_>>())
        .bind(inserts.iter().map(|m| m.aggregate_id.as_str()).collect::<Vec<_>>())
        .bind(inserts.iter().map(|m| m.version).collect::<Vec<_>>())
        .execute(&mut *conn)
        .await?;
        expect_rows("projectionist_aggregate_versions", inserts.len(), result.rows_affected())?;
    }
    if !updates.is_empty() {
        let result = sqlx::query(
            "UPDATE projectionist_aggregate_versions w SET version = u.version \
             FROM unnest($2::text[], $3::text[], $4::bigint[], $5::bigint[]) AS u(aggregate_type, aggregate_id, \
             version, expected) \
             WHERE w.projection = $1 AND w.aggregate_type = u.aggregate_type AND w.aggregate_id = u.aggregate_id AND \
             w.version = u.expected",
        )
        .bind(projection)
        .bind(updates.iter().map(|m| m.aggregate_type.as_str()).collect::<Vec<_>>())
        .bind(updates.iter().map(|m| m.aggregate_id.as_str()).collect::<Vec<_>>())
        .bind(updates.iter().map(|m| m.version).collect::<Vec<_>>())
        .bind(updates.iter().map(|m| m.expected.unwrap_or_default()).collect::<Vec<_>>())
        .execute(&mut *conn)
        .await?;
        expect_rows("projectionist_aggregate_versions", updates.len(), result.rows_affected())?;
    }
    Ok(())
}

/// How a statement computes one column, by what the plan holds for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ColumnKind {
    /// `c = value`.
    Set,
    /// `c = t.c + value` (a merge's insert: `c = value`).
    Add,
    /// `c = ((t.c + d1) + d2) + …`.
    FoldStored,
    /// `c = ((value + d1) + d2) + …`.
    FoldValue,
    /// An integer column and integer deltas: `c = t.c + sum`, computed exactly, failing
    /// exactly when one of the steps of `FoldStored` would overflow (the lowest or the
    /// highest running sum leaves the type's range), without a fold per row.
    SumStored(IntType),
}

/// An integer column type, by its declaration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum IntType {
    Small,
    Int,
    Big,
}

impl IntType {
    /// The integer type a declaration such as `bigint NOT NULL DEFAULT 0` starts with.
    fn of(declared: &str) -> Option<Self> {
        let first = declared.split_whitespace().next()?;
        let is = |names: &[&str]| names.iter().any(|n| first.eq_ignore_ascii_case(n));
        if is(&["smallint", "int2"]) {
            Some(Self::Small)
        } else if is(&["integer", "int", "int4"]) {
            Some(Self::Int)
        } else if is(&["bigint", "int8"]) {
            Some(Self::Big)
        } else {
            None
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Small => "smallint",
            Self::Int => "integer",
            Self::Big => "bigint",
        }
    }

    fn range(self) -> (i128, i128) {
        match self {
            Self::Small => (i16::MIN.into(), i16::MAX.into()),
            Self::Int => (i32::MIN.into(), i32::MAX.into()),
            Self::Big => (i64::MIN.into(), i64::MAX.into()),
        }
    }

    /// `base + d1 + d2 + …` when every value is an integer and every step stays in the
    /// type's range; `None` sends the column to the fold (which raises what a step raises).
    fn total(self, base: &Value, deltas: &[&Value]) -> Option<i64> {
        let (min, max) = self.range();
        let (lo, hi, sum) = self.sums(deltas)?;
        let base = i128::from(base.as_i64()?);
        let fits = |v: i128| (min..=max).contains(&v);
        (fits(base) && fits(base + lo) && fits(base + hi)).then(|| (base + sum) as i64)
    }

    /// The lowest and highest running sums of `deltas` (0 included) and their sum, when
    /// every delta is an integer the type takes; `None` sends the column to the fold.
    fn sums(self, deltas: &[&Value]) -> Option<(i128, i128, i128)> {
        let (min, max) = self.range();
        let (mut lo, mut hi, mut sum) = (0_i128, 0_i128, 0_i128);
        for d in deltas {
            let d = d.as_i64().map(i128::from).or_else(|| d.as_u64().map(i128::from))?;
            if d < min || d > max {
                return None;
            }
            sum += d;
            (lo, hi) = (lo.min(sum), hi.max(sum));
        }
        Some((lo, hi, sum))
    }
}

impl ColumnKind {
    fn folds(self) -> bool {
        matches!(self, Self::FoldStored | Self::FoldValue)
    }
}

/// What one statement does: its kind of row write, touching these columns in these ways.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Shape {
    kind: RowKind,
    columns: Vec<(&'static str, ColumnKind)>,
}

/// Row writes grouped by table and shape, one statement each, in plan order: each row
/// encoded once, straight into the JSON array text its statement reads.
fn group<'r, 'a: 'r>(rows: impl IntoIterator<Item = &'r RowWrite<'a>>) -> Vec<(Table, Shape, Rows)> {
    let mut groups: Vec<(Table, Shape, Rows)> = Vec::new();
    let (mut doc, mut shape) = (Vec::new(), Shape { kind: RowKind::Update, columns: Vec::new() });
    for row in rows {
        doc.clear();
        encode(row, &mut doc, &mut shape);
        match groups.iter_mut().find(|(t, s, _)| t.name() == row.table.name() && *s == shape) {
            Some((_, _, rows)) => rows.push(&doc),
            None => {
                let mut rows = Rows::default();
                rows.push(&doc);
                groups.push((row.table, shape.clone(), rows));
            }
        }
    }
    groups
}

/// A statement's rows: a JSON array, as text, and how many.
#[derive(Default)]
struct Rows {
    json: Vec<u8>,
    count: usize,
}

impl Rows {
    fn push(&mut self, doc: &[u8]) {
        self.json.push(if self.count == 0 { b'[' } else { b',' });
        self.json.extend_from_slice(doc);
        self.count += 1;
    }

    /// The array's text, sent as is and read as `jsonb` by PostgreSQL (which parses it
    /// anyway: checking it here too cost about 2 % of the CPU of a bulk load).
    fn into_text(mut self) -> String {
        self.json.push(b']');
        String::from_utf8(self.json).expect("serde_json writes UTF-8")
    }
}

async fn write_rows(conn: &mut PgConnection, table: Table, shape: &Shape, rows: Rows) -> Result<()> {
    let name = Ident::new(table.name())?;
    let key = Ident::new(table.key())?;
    let version = table.is_gated().then(|| Ident::new(table.version())).transpose()?;
    // A child table's rows are keyed by the aggregate id and the child's key together; a
    // fan-in table's may be keyed by two columns.
    let child = (!table.child_key().is_empty()).then(|| Ident::new(table.child_key())).transpose()?;
    let (keys, same_row) = match &child {
        Some(child) => (format!("{key}, {child}"), format!("t.{key} = s.{key} AND t.{child} = s.{child}")),
        None => (key.to_string(), format!("t.{key} = s.{key}")),
    };
    let columns = shape.columns.iter().map(|(c, kind)| Ok((*c, Ident::new(c)?, *kind))).collect::<Result<Vec<_>>>()?;
    // The rows as typed records of the table, each with the version it must still have
    // and, per folded column, its deltas.
    let mut extra = vec!["(x.doc->>'$expected')::bigint AS \"$expected\"".to_owned()];
    extra.extend(
        columns.iter().filter(|(_, _, k)| k.folds()).map(|(raw, ..)| format!("x.doc->'{raw}$d' AS \"{raw}$d\"")),
    );
    for (raw, ..) in columns.iter().filter(|(_, _, k)| matches!(k, ColumnKind::SumStored(_))) {
        for part in ["lo", "hi", "sum"] {
            extra.push(format!("(x.doc->>'{raw}${part}')::numeric AS \"{raw}${part}\""));
        }
    }
    // `LIMIT $2`, the number of rows, tells the planner how few rows a small batch holds:
    // `jsonb_array_elements` alone counts for 100 rows whatever the array, and a batch at the
    // head (tens of rows) was joined to a table of some thousands by a hash over a scan of
    // the whole table (3.3 ms for 60 rows of 7,700, against 0.9 ms through the key's index).
    // A large batch still counts for 100 rows: planned for its true size, a bulk load took the
    // scans and ran 15-25 % slower in the bench's pipeline arm.
    let source = format!(
        "(SELECT r.*, {} FROM (SELECT doc FROM jsonb_array_elements($1::jsonb) AS e(doc) LIMIT $2) AS x, \
        LATERAL jsonb_populate_record(NULL::{name}, x.doc) AS r) AS s",
        extra.join(", ")
    );
    let fold = |raw: &str, column: &Ident, base: &str| {
        format!(
            "(SELECT projectionist_fold(f.v ORDER BY f.n) FROM (SELECT 0::bigint AS n, {base} AS v UNION ALL \
             SELECT d.ordinality, d.{column} FROM jsonb_populate_recordset(NULL::{name}, s.\"{raw}$d\") WITH \
             ORDINALITY AS d) AS f)"
        )
    };
    let value = |(raw, column, kind): &(&str, Ident, ColumnKind)| match kind {
        ColumnKind::Set | ColumnKind::Add => format!("s.{column}"),
        ColumnKind::FoldValue => fold(raw, column, &format!("s.{column}")),
        ColumnKind::FoldStored => fold(raw, column, &format!("t.{column}")),
        ColumnKind::SumStored(ty) => {
            let (min, max) = ty.range();
            let at = |part: &str| format!("t.{column}::numeric + s.\"{raw}${part}\"");
            // Past the type's range, the cast raises the overflow a step per event raises.
            format!(
                "CASE WHEN {hi} > {max} THEN ({hi})::{ty} WHEN {lo} < {min} THEN ({lo})::{ty} ELSE ({sum})::{ty} END",
                hi = at("hi"),
                lo = at("lo"),
                sum = at("sum"),
                ty = ty.name()
            )
        }
    };
    let (sql, check) = match shape.kind {
        RowKind::Insert | RowKind::Merge => {
            let mut names = vec![key.to_string()];
            let mut values = vec![format!("s.{key}")];
            if let Some(child) = &child {
                names.push(child.to_string());
                values.push(format!("s.{child}"));
            }
            for c in &columns {
                names.push(c.1.to_string());
                values.push(value(c));
            }
            if let Some(version) = &version {
                names.push(version.to_string());
                values.push(format!("s.{version}"));
            }
            let conflict = if shape.kind == RowKind::Insert || columns.is_empty() {
                "DO NOTHING".to_owned()
            } else {
                let sets = columns.iter().map(|(_, c, kind)| match kind {
                    ColumnKind::Add => format!("{c} = t.{c} + EXCLUDED.{c}"),
                    _ => format!("{c} = EXCLUDED.{c}"),
                });
                format!("DO UPDATE SET {}", sets.collect::<Vec<_>>().join(", "))
            };
            let sql = format!(
                "INSERT INTO {name} AS t ({}) SELECT {} FROM {source} ON CONFLICT ({keys}) {conflict}",
                names.join(", "),
                values.join(", ")
            );
            (sql, shape.kind == RowKind::Insert || !columns.is_empty())
        }
        // A gated row at the version it must still have (counted); a fan-in row whatever it
        // holds (one that is not there deletes nothing, as one event at a time does).
        RowKind::Delete => match &version {
            Some(version) => (
                format!("DELETE FROM {name} AS t USING {source} WHERE {same_row} AND t.{version} = s.\"$expected\""),
                true,
            ),
            None => (format!("DELETE FROM {name} AS t USING {source} WHERE {same_row}"), false),
        },
        // What the row would have been written, evaluated against it as stored (each
        // column as an update computes it), nothing written: a value the update would have
        // refused (an add's overflow) raises here.
        RowKind::Check => {
            let values = columns.iter().map(|c| match c.2 {
                ColumnKind::Add => format!("t.{col} + s.{col}", col = c.1),
                _ => value(c),
            });
            (
                format!("SELECT {} FROM {name} AS t, {source} WHERE {same_row}", values.collect::<Vec<_>>().join(", ")),
                false,
            )
        }
        // Every child of each aggregate, however many there are.
        RowKind::Clear => (format!("DELETE FROM {name} AS t USING {source} WHERE t.{key} = s.{key}"), false),
        RowKind::Update => {
            let mut sets: Vec<String> = columns
                .iter()
                .map(|c| match c.2 {
                    ColumnKind::Add => format!("{col} = t.{col} + s.{col}", col = c.1),
                    _ => format!("{} = {}", c.1, value(c)),
                })
                .collect();
            let mut guard = same_row;
            if let Some(version) = &version {
                sets.push(format!("{version} = s.{version}"));
                guard.push_str(&format!(" AND t.{version} = s.\"$expected\""));
            }
            (format!("UPDATE {name} AS t SET {} FROM {source} WHERE {guard}", sets.join(", ")), true)
        }
    };
    let planned = rows.count;
    let result = sqlx::query(&sql).bind(rows.into_text()).bind(planned as i64).execute(&mut *conn).await?;
    if check {
        expect_rows(table.name(), planned, result.rows_affected())?;
    }
    Ok(())
}

/// A row's statement shape, and into `out` the JSON object `jsonb_populate_record` reads
/// for it: key, base values, version, the version the row must still have, per folded
/// column its deltas as `{"c$d": [{"c": d}, …]}`, per summed column `c$lo`, `c$hi` and
/// `c$sum`.
fn encode(row: &RowWrite, out: &mut Vec<u8>, shape: &mut Shape) {
    let table = &row.table;
    let mut doc = Doc::new(out);
    doc.field(table.key(), "", &row.key);
    if let Some(child) = row.child {
        doc.field(table.child_key(), "", &child);
    }
    shape.kind = row.kind;
    let columns = &mut shape.columns;
    columns.clear();
    for column in &row.columns {
        let name = column.column;
        let deltas = |doc: &mut Doc<'_>| {
            doc.key(name, "$d");
            doc.out.push(b'[');
            for (i, d) in column.deltas.iter().enumerate() {
                if i > 0 {
                    doc.out.push(b',');
                }
                let mut one = Doc::new(doc.out);
                one.field(name, "", d);
                one.end();
            }
            doc.out.push(b']');
        };
        let kind = match (&column.base, column.deltas.as_slice()) {
            (Some(base), []) => {
                doc.field(name, "", base);
                ColumnKind::Set
            }
            // An integer column, every step known: added here, exactly, as the column would.
            (Some(base), _) => {
                match table.column_type(name).and_then(IntType::of).and_then(|ty| ty.total(base, &column.deltas)) {
                    Some(total) => {
                        doc.field(name, "", &total);
                        ColumnKind::Set
                    }
                    None => {
                        doc.field(name, "", base);
                        deltas(&mut doc);
                        ColumnKind::FoldValue
                    }
                }
            }
            (None, [delta]) => {
                doc.field(name, "", delta);
                ColumnKind::Add
            }
            (None, _) => {
                let int = table.column_type(name).and_then(IntType::of);
                match int.and_then(|ty| Some((ty, ty.sums(&column.deltas)?))) {
                    Some((ty, (lo, hi, sum))) => {
                        for (part, n) in [("$lo", lo), ("$hi", hi), ("$sum", sum)] {
                            // As a string: JSON numbers past i64 would lose digits.
                            doc.key(name, part);
                            write!(doc.out, "\"{n}\"").expect("writing to a Vec");
                        }
                        ColumnKind::SumStored(ty)
                    }
                    None => {
                        deltas(&mut doc);
                        ColumnKind::FoldStored
                    }
                }
            }
        };
        columns.push((name, kind));
    }
    if let Some(version) = row.version {
        doc.field(table.version(), "", &version);
    }
    if let Some(expected) = row.expected {
        doc.field("$expected", "", &expected);
    }
    doc.end();
}

/// A JSON object written field by field.
struct Doc<'a> {
    out: &'a mut Vec<u8>,
    first: bool,
}

impl<'a> Doc<'a> {
    fn new(out: &'a mut Vec<u8>) -> Self {
        out.push(b'{');
        Self { out, first: true }
    }

    /// Writes the key `name` followed by `suffix` (JSON-escaped), and the colon.
    fn key(&mut self, name: &str, suffix: &str) {
        if !self.first {
            self.out.push(b',');
        }
        self.first = false;
        serde_json::to_writer(&mut *self.out, name).expect("a string always serialises");
        if !suffix.is_empty() {
            // Inside the key's quotes: the suffixes are plain ASCII (`$d`, `$lo`, ...).
            self.out.pop();
            self.out.extend_from_slice(suffix.as_bytes());
            self.out.push(b'"');
        }
        self.out.push(b':');
    }

    fn field(&mut self, name: &str, suffix: &str, value: &(impl Serialize + ?Sized)) {
        self.key(name, suffix);
        serde_json::to_writer(&mut *self.out, value).expect("a JSON value always serialises");
    }

    fn end(self) {
        self.out.push(b'}');
    }
}

fn expect_rows(table: &str, planned: usize, changed: u64) -> Result<()> {
    if changed == planned as u64 {
        Ok(())
    } else {
        Err(Error::Conflict { detail: format!("{table}: planned {planned} row(s), changed {changed}") })
    }
}

#[cfg(test)]
mod tests {
    use super::IntType;
    use serde_json::json;

    #[test]
    fn integer_columns_sum_exactly_with_their_running_extremes() {
        assert_eq!(IntType::of("bigint NOT NULL DEFAULT 0"), Some(IntType::Big));
        assert_eq!(IntType::of("INT4"), Some(IntType::Int));
        assert_eq!(IntType::of("smallint"), Some(IntType::Small));
        assert_eq!(IntType::of("numeric(12,2)"), None);
        assert_eq!(IntType::of("bigserial"), None);
        let ds = [&json!(5), &json!(-12), &json!(u64::MAX), &json!(-3)];
        assert_eq!(IntType::Big.sums(&ds), None, "a delta the type cannot take goes to the fold");
        let ds = [&json!(5), &json!(-12), &json!(i64::MAX), &json!(-3)];
        let max = i128::from(i64::MAX);
        assert_eq!(IntType::Big.sums(&ds), Some((-7, max - 7, max - 10)));
        assert_eq!(IntType::Small.sums(&[&json!(1.5)]), None, "not an integer: the fold");
        assert_eq!(IntType::Small.sums(&[&json!("7")]), None, "a string: the fold");
        assert_eq!(IntType::Small.total(&json!(32000), &[&json!(700), &json!(-700)]), Some(32000));
        assert_eq!(IntType::Small.total(&json!(32000), &[&json!(800), &json!(-800)]), None, "a step overflows");
        assert_eq!(IntType::Small.total(&json!(-32768), &[&json!(-1), &json!(1)]), None, "a step overflows");
        assert_eq!(IntType::Big.total(&json!("5"), &[&json!(1)]), None, "a string base: the fold");
    }
}

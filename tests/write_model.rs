//! The set-based write model against a real PostgreSQL: a batch planned and applied
//! set-based ends with the same tables and the same per-event outcomes as the per-event
//! path, on random streams with every delivery anomaly, for each gate shape and all mixed —
//! two aggregate types sharing ids, column defaults, nullable columns, fractions in
//! `numeric` and `double precision` columns, and custom `apply` in the mix;
//! two writers applying overlapping batches at once apply each event once; a projection
//! mixing writes and custom SQL works; a swap waits for a batch in flight without a deadlock.

mod common;

use std::collections::HashMap;
use std::sync::Arc;

use common::{dead_lettered, emptied, run, run_folded};

use order_status::OrderStatus;
use projectionist::postgres::park::{Source, SourceMessage};
use projectionist::postgres::{
    apply_batch, apply_batch_in, check_tables, migrate, reset, Mode, PgConnection, PgProjection, Policy,
};
use projectionist::{async_trait, ApplyError, Envelope, Outcome, Projection, RawEnvelope, Table, Writes};
use projectionist_testing::{dump_tables, envelope, interleave, with_redeliveries, ProjectionTest};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use serde_json::json;
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;

/// The events on the wire; `Noise` is a type no projection here handles.
#[derive(Serialize, Deserialize, Clone, Debug)]
#[serde(tag = "type", content = "data")]
enum Wire {
    Add { n: i64 },
    Snap { s: String },
    Bump { bucket: String, n: i64 },
    Drop { bucket: String },
    Nothing {},
    Noise {},
}

/// What the projections decode: every type but `Noise`.
#[derive(Deserialize)]
#[serde(tag = "type", content = "data")]
enum Ev {
    Add { n: i64 },
    Snap { s: String },
    Bump { bucket: String, n: i64 },
    Drop { bucket: String },
    Nothing {},
}

/// The aggregate types on the stream: both use ids `a0`, `a1`, …
const THING: &str = "thing";
const OTHER: &str = "other";

const COUNTS: Table = Table::transition("wm_counts", "id").aggregate_type(THING).columns(&[
    ("total", "bigint NOT NULL DEFAULT 0"),
    ("last", "text"),
    ("base", "bigint NOT NULL DEFAULT 1000"),
    ("maybe", "bigint"),
    ("frac", "numeric(10,2) NOT NULL DEFAULT 0.5"),
    ("ratio", "double precision"),
]);
const SNAPS: Table =
    Table::upsert("wm_snaps", "id").aggregate_type(THING).columns(&[("state", "text"), ("at", "timestamptz")]);
const BUCKETS: Table = Table::fan_in("wm_buckets", "bucket").columns(&[
    ("n", "bigint NOT NULL DEFAULT 7"),
    ("last", "text"),
    ("frac", "numeric(10,3) NOT NULL DEFAULT 1.5"),
]);
/// Fan-in rows whose writes coalesce within a batch (integers only: no rounds).
const TOTALS: Table =
    Table::fan_in("wm_totals", "bucket").columns(&[("n", "bigint NOT NULL DEFAULT 7"), ("last", "text")]);
/// Rows deleted by their aggregate's events (`Drop`): a transition table of things, an
/// upsert table of the others.
const LEDGER: Table = Table::transition("wm_ledger", "id")
    .aggregate_type(THING)
    .columns(&[("total", "bigint NOT NULL DEFAULT 0"), ("last", "text")])
    .deletable();
const CARDS: Table =
    Table::upsert("wm_cards", "id").aggregate_type(OTHER).columns(&[("state", "text"), ("n", "bigint")]).deletable();
/// A thing's lines: child rows keyed by the thing and a bucket, changed, deleted, cleared.
const LINES: Table = Table::child("wm_lines", "thing_id", "line")
    .aggregate_type(THING)
    .columns(&[("qty", "bigint NOT NULL DEFAULT 0"), ("note", "text")]);
/// Fan-in rows keyed by a day and a bucket (typed key columns).
const DAILY: Table = Table::fan_in_keys("wm_daily", &[("day", "date"), ("bucket", "text")])
    .columns(&[("n", "bigint NOT NULL DEFAULT 0")]);
const NOTES: Table = Table::custom(
    "wm_notes",
    "CREATE TABLE IF NOT EXISTS wm_notes (id text, version bigint, body text, PRIMARY KEY (id, version))",
);

/// One projection shape: writes only to the tables it owns; with `NOTES`, snaps of things
/// go to `apply`.
struct Shaped {
    name: &'static str,
    tables: &'static [Table],
}

impl Shaped {
    fn owns(&self, table: &Table) -> bool {
        self.tables.contains(table)
    }
}

#[async_trait]
impl Projection<PgConnection> for Shaped {
    type Event = Ev;

    fn name(&self) -> &str {
        self.name
    }

    fn tables(&self) -> &[Table] {
        self.tables
    }

    fn project(&self, e: &Envelope<Ev>) -> Writes {
        let mut writes = Writes::none();
        let thing = e.aggregate_type == THING;
        let counts = self.owns(&COUNTS) && thing;
        // Deletable rows: a thing's ledger row added to and deleted; an other's card set
        // and deleted. Events that write neither (`Nothing`) make no row.
        match (&e.event, thing) {
            (Ev::Drop { .. }, true) if self.owns(&LEDGER) => writes = writes.and(LEDGER.write(e).delete()),
            (Ev::Drop { .. }, false) if self.owns(&CARDS) => writes = writes.and(CARDS.write(e).delete()),
            (Ev::Add { n } | Ev::Bump { n, .. }, true) if self.owns(&LEDGER) => {
                writes = writes.and(LEDGER.write(e).add("total", n).set("last", format!("v{}", e.version)))
            }
            (Ev::Add { n } | Ev::Bump { n, .. }, false) if self.owns(&CARDS) => {
                writes = writes.and(CARDS.write(e).set("n", n).set("state", format!("v{}", e.version)))
            }
            _ => {}
        }
        // A day's bucket: bumped on the day of the bump's size, deleted by a drop on day 1.
        match &e.event {
            Ev::Bump { bucket, n } if self.owns(&DAILY) => {
                writes = writes.and(DAILY.row_keys(format!("2026-11-{:02}", 1 + n % 3), bucket).add("n", n))
            }
            Ev::Drop { bucket } if self.owns(&DAILY) => {
                writes = writes.and(DAILY.row_keys("2026-11-01", bucket).delete())
            }
            _ => {}
        }
        // A thing's lines: bumped, noted, deleted one (b2, b3) or all at once (b0, b1).
        match &e.event {
            Ev::Bump { bucket, n } if thing && self.owns(&LINES) => {
                writes = writes.and(LINES.child_row(e, bucket).add("qty", n).set("note", format!("v{}", e.version)))
            }
            Ev::Snap { s } if thing && self.owns(&LINES) => {
                writes = writes.and(LINES.child_row(e, "snap").set("note", s))
            }
            Ev::Drop { bucket } if thing && self.owns(&LINES) => match bucket.as_str() {
                "b0" | "b1" => writes = writes.and(LINES.clear(e)),
                _ => writes = writes.and(LINES.child_row(e, bucket).delete()),
            },
            _ => {}
        }
        match &e.event {
            Ev::Add { n } => {
                if counts {
                    let row = COUNTS.write(e).add("total", n).set("last", format!("add {n}")).add("base", n);
                    let row = row.add("maybe", n).add("frac", *n as f64 / 8.0).add("ratio", *n as f64 / 10.0);
                    writes = writes.and(row);
                }
                if self.owns(&BUCKETS) {
                    writes = writes.and(BUCKETS.row(format!("agg-{}", e.aggregate_id)).add("n", n));
                }
            }
            Ev::Snap { s } => {
                if self.owns(&NOTES) && thing {
                    return Writes::custom();
                }
                if self.owns(&SNAPS) && thing {
                    writes = writes.and(SNAPS.write(e).set("state", s).set("at", e.occurred_at));
                }
                if counts {
                    writes = writes.and(COUNTS.write(e).set("last", s).set("maybe", 0));
                }
            }
            Ev::Bump { bucket, n } => {
                if self.owns(&BUCKETS) {
                    let row = BUCKETS.row(bucket).add("n", n).set("last", &e.aggregate_id);
                    writes = writes.and(row.add("frac", *n as f64 / 16.0));
                }
                if self.owns(&TOTALS) {
                    writes = writes.and(TOTALS.row(bucket).add("n", n).set("last", &e.aggregate_id));
                }
                if counts {
                    writes = writes.and(COUNTS.write(e).add("total", 1));
                }
            }
            Ev::Drop { bucket } => {
                if self.owns(&BUCKETS) {
                    writes = writes.and(BUCKETS.row(bucket).delete());
                }
                if self.owns(&TOTALS) {
                    writes = writes.and(TOTALS.row(bucket).delete());
                }
            }
            Ev::Nothing {} => {
                // A fan-in row made by a set alone: later adds build on its defaults.
                if self.owns(&BUCKETS) && !thing {
                    writes = writes.and(BUCKETS.row("b0").set("last", "nothing"));
                }
                if self.owns(&TOTALS) && !thing {
                    writes = writes.and(TOTALS.row("b0").set("last", "nothing"));
                }
            }
        }
        writes
    }

    async fn apply(&self, tx: &mut PgConnection, e: &Envelope<Ev>) -> Result<Outcome, ApplyError> {
        let Ev::Snap { s } = &e.event else { return Err(ApplyError::msg("only snaps are custom")) };
        sqlx::query("UPDATE wm_counts SET last = $2 WHERE id = $1")
            .bind(&e.aggregate_id)
            .bind(s)
            .execute(&mut *tx)
            .await?;
        sqlx::query("INSERT INTO wm_notes VALUES ($1, $2, $3)")
            .bind(&e.aggregate_id)
            .bind(e.version)
            .bind(s)
            .execute(&mut *tx)
            .await?;
        Ok(Outcome::Applied)
    }
}

const SHAPES: [Shaped; 7] = [
    Shaped { name: "transition_only", tables: &[COUNTS] },
    Shaped { name: "upsert_only", tables: &[SNAPS] },
    Shaped { name: "fan_in_only", tables: &[BUCKETS, TOTALS] },
    Shaped { name: "mixed", tables: &[COUNTS, SNAPS, BUCKETS, TOTALS] },
    Shaped { name: "custom_mix", tables: &[COUNTS, BUCKETS, NOTES] },
    Shaped { name: "deleting", tables: &[LEDGER, CARDS, LINES] },
    Shaped { name: "keyed", tables: &[DAILY] },
];

/// A random delivered stream: per-aggregate histories with every event type, some events
/// lost (gaps) and some of those re-sent at the end, with `poison` a few whose data does not
/// decode and a few snaps of values the tables refuse, interleaved across aggregates,
/// duplicated, re-sent with fresh ids, and sometimes replayed from the start.
fn random_stream(seed: u64, poison: bool) -> Vec<RawEnvelope> {
    let mut rng = StdRng::seed_from_u64(seed);
    let aggregates: Vec<(&str, String)> = (0..rng.gen_range(3..15))
        .flat_map(|a| [(THING, format!("a{a}")), (OTHER, format!("a{a}"))])
        .filter(|(t, _)| *t == THING || rng.gen_bool(0.5))
        .collect();
    let mut lost = Vec::new();
    let per_aggregate: Vec<Vec<RawEnvelope>> = aggregates
        .into_iter()
        .map(|(aggregate_type, id)| {
            let len = rng.gen_range(1..20);
            let mut history = Vec::new();
            for v in 1..=len {
                let event = match rng.gen_range(0..10) {
                    0..=3 => Wire::Add { n: rng.gen_range(-50..100) },
                    // Values the tables refuse, with `poison`: by a CHECK constraint (see
                    // `REFUSED`), or by the type itself (text takes no NUL).
                    4..=5 if poison && rng.gen_bool(0.15) => {
                        Wire::Snap { s: if rng.gen_bool(0.5) { "refused".into() } else { "nul\u{0}".into() } }
                    }
                    // Text as `COPY` must escape it (a rebuild writes new rows so), and as not.
                    4..=5 => {
                        let text = ["s", "tab\t", "back\\slash ", "line\nbreak\r", "\\N", "é ✓ "][rng.gen_range(0..6)];
                        Wire::Snap { s: format!("{text}{v}") }
                    }
                    // A bucket emptied now and then: deleted, and made again by the next bump.
                    6..=7 if rng.gen_bool(0.25) => Wire::Drop { bucket: format!("b{}", rng.gen_range(0..4)) },
                    6..=7 => Wire::Bump { bucket: format!("b{}", rng.gen_range(0..4)), n: rng.gen_range(1..9) },
                    8 => Wire::Nothing {},
                    _ => Wire::Noise {},
                };
                // A few events are lost on the way: their successors are gaps; half of them
                // are published again later.
                let mut e = envelope(aggregate_type, &id, v, &event);
                if poison && rng.gen_bool(0.02) {
                    e.data = json!({ "n": "not a number", "s": 1, "bucket": 2 });
                }
                if !rng.gen_bool(0.03) {
                    history.push(e);
                } else if rng.gen_bool(0.5) {
                    lost.push(e);
                }
            }
            history
        })
        .collect();
    let mut stream = with_redeliveries(&interleave(per_aggregate, seed), 0.2, 0.05, seed + 1);
    if rng.gen_bool(0.4) {
        let again = stream.clone();
        stream.extend(again);
    }
    stream.extend(lost);
    stream
}

/// An independent oracle for the transition-only shape: each aggregate's total is the sum
/// over its first contiguous run of versions, each counted once.
fn expected_totals(stream: &[RawEnvelope]) -> HashMap<String, (i64, i64)> {
    let mut rows: HashMap<String, (i64, i64)> = HashMap::new();
    for e in stream.iter().filter(|e| e.aggregate_type == THING) {
        let (total, version) = rows.get(&e.aggregate_id).copied().unwrap_or((0, 0));
        if e.version != version + 1 {
            continue;
        }
        let add = match e.event_type.as_str() {
            "Add" => e.data["n"].as_i64().unwrap(),
            "Bump" => 1,
            _ => 0,
        };
        rows.insert(e.aggregate_id.clone(), (total + add, e.version));
    }
    rows
}

/// The oracle with gaps parked and poison dead-lettered: each aggregate's total is the sum
/// over the versions that arrived, from 1 up to the first that never did or is poison (its
/// data does not decode, or a snap of a NUL, which text refuses), each counted once.
fn expected_totals_parked(stream: &[RawEnvelope]) -> HashMap<String, (i64, i64)> {
    let mut arrived: HashMap<String, HashMap<i64, Option<i64>>> = HashMap::new();
    for e in stream.iter().filter(|e| e.aggregate_type == THING) {
        let add = match e.event_type.as_str() {
            "Add" => e.data["n"].as_i64(),
            "Bump" => e.data["n"].as_i64().map(|_| 1),
            "Snap" => e.data["s"].as_str().filter(|s| !s.contains('\0')).map(|_| 0),
            "Drop" => e.data["bucket"].as_str().map(|_| 0),
            _ => Some(0),
        };
        arrived.entry(e.aggregate_id.clone()).or_default().entry(e.version).or_insert(add);
    }
    arrived
        .into_iter()
        .filter_map(|(id, versions)| {
            let (mut total, mut version) = (0, 0);
            while let Some(Some(add)) = versions.get(&(version + 1)) {
                total += add;
                version += 1;
            }
            (version > 0).then_some((id, (total, version)))
        })
        .collect()
}

#[sqlx::test(migrations = false)]
async fn with_gaps_parked_and_poison_dead_lettered_batches_equal_the_per_event_path(pool: PgPool) {
    let projections: Vec<&dyn PgProjection> = SHAPES.iter().map(|s| s as &dyn PgProjection).collect();
    migrate(&pool, &projections).await.unwrap();
    sqlx::raw_sql(REFUSED).execute(&pool).await.unwrap();
    let mut seen = HashMap::new();
    let mut dead_letters = 0;
    let mut reasons: HashMap<(&str, String), usize> = HashMap::new();
    for seed in 0..12 {
        let stream = random_stream(seed, true);
        for shape in &SHAPES {
            let park = Policy::default();
            let (per_event, per_event_tables) = run(&pool, shape, &stream, (Mode::PerEvent, park), seed).await;
            let per_event_letters = dead_lettered(&pool, shape.name).await;
            let (batched, batched_tables) = run(&pool, shape, &stream, (Mode::Batch, park), seed + 100).await;
            let batched_letters = dead_lettered(&pool, shape.name).await;
            let (whole, whole_tables) = run_whole(&pool, shape, &stream).await;
            let whole_letters = dead_lettered(&pool, shape.name).await;
            assert_eq!(batched_tables, per_event_tables, "seed {seed}, {}: tables differ", shape.name);
            assert_eq!(whole_tables, per_event_tables, "seed {seed}, {}: one batch differs", shape.name);
            assert_eq!(batched_letters, per_event_letters, "seed {seed}, {}: dead letters differ", shape.name);
            assert_eq!(whole_letters, per_event_letters, "seed {seed}, {}: dead letters differ", shape.name);
            for (_, _, _, reason) in whole_letters {
                *reasons.entry((shape.name, reason)).or_insert(0) += 1;
            }
            assert!(!batched.iter().chain(&per_event).any(|o| matches!(o, Outcome::Gap { .. })), "gaps park");
            for o in per_event.iter().chain(&whole) {
                *seen.entry((shape.name, o.label())).or_insert(0) += 1;
            }
            dead_letters += whole.iter().filter(|o| **o == Outcome::DeadLettered).count();
            if shape.name == "transition_only" {
                let rows: Vec<(String, i64, i64)> =
                    sqlx::query_as("SELECT id, total, version FROM wm_counts").fetch_all(&pool).await.unwrap();
                let got: HashMap<String, (i64, i64)> = rows.into_iter().map(|(id, t, v)| (id, (t, v))).collect();
                assert_eq!(got, expected_totals_parked(&stream), "seed {seed}: totals against the oracle");
            }
        }
    }
    // Events were parked, and held events of earlier batches drained (applied in a later
    // batch, in the per-event runs) as well as within one batch (the whole-stream runs).
    for shape in SHAPES.iter().filter(|s| s.name != "upsert_only") {
        let parked = seen.get(&(shape.name, "parked")).copied().unwrap_or(0);
        assert!(parked > 0, "{} never parked: {seen:?}", shape.name);
    }
    let parked: (i64, i64) =
        sqlx::query_as("SELECT (SELECT count(*) FROM projectionist_parked), (SELECT count(*) FROM projectionist_held)")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(parked.0 > 0 && parked.1 > 0, "some gaps were never filled: {parked:?}");
    assert!(dead_letters > 0, "poison events were dead-lettered");
    for shape in ["transition_only", "upsert_only", "mixed"] {
        let refused = reasons.get(&(shape, "value".to_owned()));
        assert!(refused.is_some_and(|n| *n > 0), "{shape}: no value refused: {reasons:?}");
    }
}

/// A fan-in row deleted stays deleted when the stream is replayed from its start and
/// redelivered (the aggregate version gates the delete and every write before it), and a
/// later write creates it again as new: whether the stream is one batch, batches of three
/// (a row's set, delete and add coalesced into a delete and an insert), of two, or one
/// event at a time.
#[sqlx::test(migrations = false)]
async fn a_deleted_fan_in_row_stays_deleted_on_replay_and_a_later_write_makes_it_anew(pool: PgPool) {
    let shape = &SHAPES[2];
    migrate(&pool, &[shape as &dyn PgProjection]).await.unwrap();
    let e = |id: &str, v, event: Wire| envelope(OTHER, id, v, &event);
    let bump = |bucket: &str, n| Wire::Bump { bucket: bucket.into(), n };
    let drop = |bucket: &str| Wire::Drop { bucket: bucket.into() };
    let history = vec![
        // Set, deleted, added to: nothing of the set is left, the add makes the row (in a
        // batch of their own, coalesced; with the adds below, the table goes in rounds).
        e("a3", 1, Wire::Nothing {}),
        e("a3", 2, drop("b0")),
        e("a3", 3, bump("b0", 2)),
        e("a1", 1, bump("b1", 5)),
        e("a2", 1, bump("b2", 3)),
        e("a1", 2, drop("b1")),
        e("a2", 2, drop("b2")),
        e("a2", 3, bump("b2", 4)),
    ];
    // Replayed from the start, then a duplicate of each event of the history.
    let mut stream = history.clone();
    stream.extend(history.clone());
    stream.extend(history.iter().rev().cloned());
    // What the table holds after one bump of a row that is not there.
    let fresh = [e("a2", 1, bump("b2", 4)), e("a3", 1, bump("b0", 2))];
    let (_, anew) = run(&pool, shape, &fresh, (Mode::PerEvent, Policy::default()), 0).await;
    let rows = [{ json!({ "bucket": "b0", "n": 2, "last": "a3" }) }, json!({ "bucket": "b2", "n": 4, "last": "a2" })];
    assert_eq!(anew["wm_totals"], json!(rows));
    for (mode, batch) in [(Mode::Batch, stream.len()), (Mode::Batch, 3), (Mode::Batch, 2), (Mode::PerEvent, 1)] {
        emptied(&pool, shape).await;
        for events in stream.chunks(batch) {
            apply_batch_in(&pool, shape, events, mode, Policy::default()).await.unwrap();
        }
        let tables = dump_tables(&pool, shape).await;
        let what = format!("{mode:?} in batches of {batch}");
        assert_eq!(tables["wm_buckets"], anew["wm_buckets"], "{what}: b1 deleted, b2 made anew by its last bump");
        assert_eq!(tables["wm_totals"], anew["wm_totals"], "{what}: b1 deleted, b2 made anew by its last bump");
        let versions = json!([["other", "a1", 2], ["other", "a2", 3], ["other", "a3", 3]]);
        assert_eq!(tables["projectionist_aggregate_versions"], versions, "{what}");
    }
}

/// A deletable table's row, deleted, stays deleted when the stream is replayed from its
/// start and redelivered (its version is kept without it); an event that writes nothing
/// to it moves that version without making the row; the next write makes it again (an
/// aggregate that reopens) — in one batch, batches of two, or one event at a time. An
/// upsert table's deleted row comes back only with a newer version, skipping as upserts do.
#[sqlx::test(migrations = false)]
async fn a_deleted_row_stays_deleted_on_replay_and_comes_back_with_a_later_version(pool: PgPool) {
    let shape = &SHAPES[5];
    migrate(&pool, &[shape as &dyn PgProjection]).await.unwrap();
    let thing = |v, event| envelope(THING, "a1", v, &event);
    let other = |v, event| envelope(OTHER, "o1", v, &event);
    let drop = || Wire::Drop { bucket: String::new() };
    let history = vec![
        thing(1, Wire::Add { n: 5 }),
        thing(2, Wire::Add { n: 6 }),
        thing(3, drop()),
        thing(4, Wire::Nothing {}),
        other(1, Wire::Bump { bucket: String::new(), n: 1 }),
        other(2, drop()),
        thing(5, Wire::Add { n: 7 }),
        // Skipping versions: an upsert's row comes back at v5.
        other(5, Wire::Bump { bucket: String::new(), n: 5 }),
    ];
    let mut stream = history.clone();
    stream.extend(history.clone());
    stream.extend(history.iter().rev().cloned());
    let want = json!({
        "wm_ledger": [{ "id": "a1", "total": 7, "last": "v5", "version": 5 }],
        "wm_cards": [{ "id": "o1", "n": 5, "state": "v5", "version": 5 }],
    });
    for (mode, batch) in [(Mode::Batch, stream.len()), (Mode::Batch, 3), (Mode::Batch, 2), (Mode::PerEvent, 1)] {
        emptied(&pool, shape).await;
        let mut outcomes = Vec::new();
        for events in stream.chunks(batch) {
            outcomes.extend(apply_batch_in(&pool, shape, events, mode, Policy::default()).await.unwrap());
        }
        let what = format!("{mode:?} in batches of {batch}");
        let tables = dump_tables(&pool, shape).await;
        assert_eq!(tables["wm_ledger"], want["wm_ledger"], "{what}");
        assert_eq!(tables["wm_cards"], want["wm_cards"], "{what}");
        let applied = outcomes.iter().filter(|o| **o == Outcome::Applied).count();
        assert_eq!(applied, history.len(), "{what}: each event applied once: {outcomes:?}");
    }
    // Deleted and not made again: gone after a replay too, its events stale or duplicates,
    // whether replayed together or the creating event alone.
    for mode in [Mode::Batch, Mode::PerEvent] {
        emptied(&pool, shape).await;
        let closed = [thing(1, Wire::Add { n: 5 }), thing(2, drop())];
        let first = apply_batch_in(&pool, shape, &closed, mode, Policy::default()).await.unwrap();
        let again = apply_batch_in(&pool, shape, &closed, mode, Policy::default()).await.unwrap();
        let alone = apply_batch_in(&pool, shape, &closed[..1], mode, Policy::default()).await.unwrap();
        assert_eq!(first, vec![Outcome::Applied; 2], "{mode:?}");
        assert_eq!((again, alone), (vec![Outcome::Stale, Outcome::Duplicate], vec![Outcome::Stale]), "{mode:?}");
        assert_eq!(dump_tables(&pool, shape).await["wm_ledger"], json!([]), "{mode:?}");
    }
}

/// A thing's child rows: added to, deleted one by one and cleared all at once, made again
/// after the clear; replayed from the start and redelivered, the lines end as the history
/// left them — in one batch, batches of three and two, or one event at a time.
#[sqlx::test(migrations = false)]
async fn child_rows_deleted_and_cleared_stay_so_on_replay(pool: PgPool) {
    let shape = &SHAPES[5];
    migrate(&pool, &[shape as &dyn PgProjection]).await.unwrap();
    // Created with the key of both columns, which the drift check finds as declared; a
    // table keyed otherwise is drift.
    check_tables(&pool, shape).await.unwrap();
    let key: Vec<String> = sqlx::query_scalar(
        "SELECT a.attname::text FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid \
         AND a.attnum = ANY(i.indkey) WHERE i.indrelid = 'wm_lines'::regclass AND i.indisprimary ORDER BY a.attnum",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(key, ["thing_id", "line"]);
    sqlx::raw_sql(
        "ALTER TABLE wm_lines DROP CONSTRAINT wm_lines_pkey; ALTER TABLE wm_lines ADD PRIMARY KEY (line, thing_id)",
    )
    .execute(&pool)
    .await
    .unwrap();
    let drift = check_tables(&pool, shape).await.unwrap_err().to_string();
    assert!(drift.contains("primary key"), "{drift}");
    sqlx::raw_sql("DROP TABLE wm_lines").execute(&pool).await.unwrap();
    migrate(&pool, &[shape as &dyn PgProjection]).await.unwrap();
    let thing = |v, event| envelope(THING, "a1", v, &event);
    let bump = |line: &str, n| Wire::Bump { bucket: line.into(), n };
    let drop = |line: &str| Wire::Drop { bucket: line.into() };
    let history = vec![
        thing(1, bump("b2", 5)),
        thing(2, bump("b3", 6)),
        thing(3, bump("b2", 1)),
        thing(4, drop("b2")),
        // Noted, then cleared in the same batch of three: the note never reaches the table.
        thing(5, Wire::Snap { s: "gone".into() }),
        thing(6, drop("b0")),
        thing(7, bump("b3", 2)),
        thing(8, bump("b1", 4)),
    ];
    let mut stream = history.clone();
    stream.extend(history.clone());
    stream.extend(history.iter().rev().cloned());
    let want = vec![("b1".to_owned(), 4, "v8".to_owned()), ("b3".to_owned(), 2, "v7".to_owned())];
    for (mode, batch) in [(Mode::Batch, stream.len()), (Mode::Batch, 3), (Mode::Batch, 2), (Mode::PerEvent, 1)] {
        emptied(&pool, shape).await;
        for events in stream.chunks(batch) {
            apply_batch_in(&pool, shape, events, mode, Policy::default()).await.unwrap();
        }
        let lines: Vec<(String, i64, String)> =
            sqlx::query_as("SELECT line, qty, note FROM wm_lines ORDER BY line").fetch_all(&pool).await.unwrap();
        assert_eq!(lines, want, "{mode:?} in batches of {batch}");
    }
}

/// Fan-in rows keyed by a date and a text column: each (day, bucket) its own row, a delete
/// removes only its own, whatever the batches.
#[sqlx::test(migrations = false)]
async fn rows_keyed_by_two_typed_columns_are_written_and_deleted_by_both_keys(pool: PgPool) {
    let shape = &SHAPES[6];
    migrate(&pool, &[shape as &dyn PgProjection]).await.unwrap();
    let e = |id: &str, v, event| envelope(OTHER, id, v, &event);
    let bump = |bucket: &str, n| Wire::Bump { bucket: bucket.into(), n };
    let history = vec![
        e("a1", 1, bump("x", 3)), // 2026-11-01 x
        e("a2", 1, bump("y", 3)), // 2026-11-01 y
        e("a1", 2, bump("x", 4)), // 2026-11-02 x
        e("a2", 2, bump("y", 6)), // 2026-11-01 y
        e("a1", 3, Wire::Drop { bucket: "x".into() }),
        e("a3", 1, bump("x", 1)), // 2026-11-02 x
    ];
    let mut stream = history.clone();
    stream.extend(history.iter().rev().cloned());
    let want: Vec<(String, String, i64)> =
        vec![("2026-11-01".into(), "y".into(), 9), ("2026-11-02".into(), "x".into(), 5)];
    for (mode, batch) in [(Mode::Batch, stream.len()), (Mode::Batch, 2), (Mode::PerEvent, 1)] {
        emptied(&pool, shape).await;
        for events in stream.chunks(batch) {
            apply_batch_in(&pool, shape, events, mode, Policy::default()).await.unwrap();
        }
        let rows: Vec<(String, String, i64)> =
            sqlx::query_as("SELECT day::text, bucket, n FROM wm_daily ORDER BY day, bucket")
                .fetch_all(&pool)
                .await
                .unwrap();
        assert_eq!(rows, want, "{mode:?} in batches of {batch}");
    }
}

/// The engine begins each batch's transaction holding the projection's swap lock in the
/// `BEGIN`'s round trip: the very lock a swap takes exclusively (not free while the batch
/// is open, free once it commits); a name that is not a projection's is refused.
#[sqlx::test(migrations = false)]
async fn a_transaction_begun_sharing_the_swap_lock_holds_a_swap_back(pool: PgPool) {
    use projectionist::postgres::rebuild::begin_sharing_swap_lock;
    let swap_free = |pool: PgPool| async move {
        let mut tx = pool.begin().await.unwrap();
        let free: bool = sqlx::query_scalar("SELECT pg_try_advisory_xact_lock(hashtext('projectionist.swap.' || $1))")
            .bind("wm_swapped")
            .fetch_one(&mut *tx)
            .await
            .unwrap();
        tx.rollback().await.unwrap();
        free
    };
    let mut conn = pool.acquire().await.unwrap();
    let batch = begin_sharing_swap_lock(&mut conn, "wm_swapped").await.unwrap();
    assert!(!swap_free(pool.clone()).await, "a swap waits while the batch is open");
    batch.commit().await.unwrap();
    assert!(swap_free(pool.clone()).await, "and goes once it committed");
    let refused = begin_sharing_swap_lock(&mut conn, "x'); DROP TABLE t; --").await;
    assert!(refused.is_err_and(|e| e.to_string().contains("not a valid projection name")));
}

/// A rebuild holding the live writers back for its last round (`rebuild::hold`) holds back
/// a live batch, not its own shadow's: a session of the shadow writes under a swap lock of
/// its own (under a steady stream, the rebuild used to give up after 20 rounds, each ending a
/// little behind the live run).
#[sqlx::test(migrations = false)]
async fn a_hold_on_the_live_writers_leaves_the_shadows_writing(pool: PgPool) {
    use projectionist::postgres::rebuild::{begin_sharing_swap_lock, enter_shadow, hold, shadow_search_path};
    let held = hold(&pool, "wm_held").await.unwrap();
    let mut live = pool.acquire().await.unwrap().detach();
    let waits =
        tokio::time::timeout(std::time::Duration::from_millis(500), begin_sharing_swap_lock(&mut live, "wm_held"));
    assert!(waits.await.is_err(), "a live batch waits for the hold");
    let mut shadow = pool.acquire().await.unwrap().detach();
    let path = shadow_search_path(&mut shadow, "wm_held").await.unwrap();
    enter_shadow(&mut shadow, &path, "wm_held").await.unwrap();
    let begun =
        tokio::time::timeout(std::time::Duration::from_secs(5), begin_sharing_swap_lock(&mut shadow, "wm_held")).await;
    begun.expect("the shadow's batch does not wait").unwrap().commit().await.unwrap();
    drop(held);
    let mut live = pool.acquire().await.unwrap();
    let begun =
        tokio::time::timeout(std::time::Duration::from_secs(5), begin_sharing_swap_lock(&mut live, "wm_held")).await;
    begun.expect("let go, the hold no longer holds live batches back").unwrap().commit().await.unwrap();
}

/// A value PostgreSQL refuses (an add past `bigint`), then its row deleted in the same
/// batch: refused and dead-lettered as one event at a time refuses it, not coalesced away.
#[sqlx::test(migrations = false)]
async fn a_value_refused_before_its_row_is_deleted_is_refused_in_a_batch_too(pool: PgPool) {
    let shape = &Shaped { name: "totals_only", tables: &[TOTALS] };
    migrate(&pool, &[shape as &dyn PgProjection]).await.unwrap();
    let bump = |id: &str, n| envelope(OTHER, id, 1, &Wire::Bump { bucket: "b5".into(), n });
    let stream =
        [bump("a1", i64::MAX - 3), bump("a2", 10), envelope(OTHER, "a3", 1, &Wire::Drop { bucket: "b5".into() })];
    let mut seen = Vec::new();
    for mode in [Mode::PerEvent, Mode::Batch] {
        emptied(&pool, shape).await;
        let outcomes = apply_batch_in(&pool, shape, &stream, mode, Policy::default()).await.unwrap();
        seen.push((outcomes, dump_tables(&pool, shape).await, dead_lettered(&pool, shape.name).await));
    }
    assert_eq!(seen[0].0, vec![Outcome::Applied, Outcome::DeadLettered, Outcome::Applied]);
    assert_eq!(seen[1], seen[0], "batched as one event at a time");
}

/// An add that overflows what a stored row holds, then the row deleted in the same batch:
/// the batch checks the dropped add against the stored row, and refuses it as one event at
/// a time does (seen passing wrongly with the check left out: the add dropped, applied).
#[sqlx::test(migrations = false)]
async fn an_add_past_what_the_stored_row_holds_is_refused_though_the_batch_deletes_the_row(pool: PgPool) {
    let shape = &Shaped { name: "totals_stored", tables: &[TOTALS] };
    migrate(&pool, &[shape as &dyn PgProjection]).await.unwrap();
    let bump = |id: &str, v, n| envelope(OTHER, id, v, &Wire::Bump { bucket: "b5".into(), n });
    let drop = |id: &str, v| envelope(OTHER, id, v, &Wire::Drop { bucket: "b5".into() });
    let before = [bump("a1", 1, i64::MAX - 3)];
    let batch = [bump("a2", 1, 2), bump("a1", 2, 10), drop("a3", 1)];
    let mut seen = Vec::new();
    for mode in [Mode::PerEvent, Mode::Batch] {
        emptied(&pool, shape).await;
        apply_batch_in(&pool, shape, &before, mode, Policy::default()).await.unwrap();
        let outcomes = apply_batch_in(&pool, shape, &batch, mode, Policy::default()).await.unwrap();
        seen.push((outcomes, dump_tables(&pool, shape).await, dead_lettered(&pool, shape.name).await));
    }
    assert_eq!(seen[0].0, vec![Outcome::Applied, Outcome::DeadLettered, Outcome::Applied]);
    assert_eq!(seen[1], seen[0], "batched as one event at a time");
}

/// A transition table whose columns are added to and set, never both: what folds across
/// batches (a row created by an event that leaves columns to their defaults, then added to).
const TALLIES: Table = Table::transition("wm_tallies", "id").aggregate_type(THING).columns(&[
    ("n", "bigint NOT NULL DEFAULT 100"),
    ("tag", "text"),
    ("frac", "numeric NOT NULL DEFAULT 0.5"),
    ("maybe", "bigint"),
    ("ratio", "double precision"),
]);

/// Writes [`TALLIES`]: adds of every number an event carries, sets of tags.
struct Tallies;

impl Projection<PgConnection> for Tallies {
    type Event = Ev;

    fn name(&self) -> &str {
        "tallies"
    }

    fn tables(&self) -> &[Table] {
        &[TALLIES]
    }

    fn project(&self, e: &Envelope<Ev>) -> Writes {
        if e.aggregate_type != THING {
            return Writes::none();
        }
        let row = TALLIES.write(e);
        match &e.event {
            Ev::Add { n } => row.add("n", n).add("frac", *n as f64 / 8.0).add("maybe", n).add("ratio", *n as f64 / 3.0),
            Ev::Snap { s } => row.set("tag", s),
            Ev::Bump { n, .. } => row.add("n", n).set("tag", format!("bump {n}")),
            Ev::Drop { .. } | Ev::Nothing {} => row,
        }
        .into()
    }
}

/// `stream` without the deliveries that would be gaps (duplicates and stale re-sends stay).
fn gap_free(stream: &[RawEnvelope]) -> Vec<RawEnvelope> {
    let mut at: HashMap<(String, String), i64> = HashMap::new();
    let mut kept = Vec::new();
    for e in stream {
        let version = at.entry((e.aggregate_type.clone(), e.aggregate_id.clone())).or_default();
        if e.version <= *version + 1 {
            *version = (*version).max(e.version);
            kept.push(e.clone());
        }
    }
    kept
}

/// A rebuild's bulk load folds batches in memory and writes each row about once; whatever
/// the cuts and wherever the fold is written, the tables and outcomes equal the per-event
/// path's, with gaps halting or parked and poison dead-lettered around the folded batches.
#[sqlx::test(migrations = false)]
async fn folded_batches_equal_the_per_event_path(pool: PgPool) {
    let projections: Vec<&dyn PgProjection> = SHAPES.iter().map(|s| s as &dyn PgProjection).collect();
    migrate(&pool, &projections).await.unwrap();
    let mut folded: HashMap<&str, usize> = HashMap::new();
    for seed in 0..12 {
        // Gap-free streams (what a rebuild mostly reads), streams with gaps that halt, and
        // streams with gaps parked and poison dead-lettered.
        let (poison, policy) = if seed % 3 == 2 { (true, Policy::default()) } else { (false, Policy::HALT) };
        let stream = random_stream(seed, poison);
        let stream = if seed % 3 == 0 { gap_free(&stream) } else { stream };
        for shape in &SHAPES {
            let (per_event, per_event_tables) = run(&pool, shape, &stream, (Mode::PerEvent, policy), seed).await;
            let per_event_letters = dead_lettered(&pool, shape.name).await;
            let (outcomes, tables, n) = run_folded(&pool, shape, &stream, policy, (seed + 200, 80)).await;
            assert_eq!(tables, per_event_tables, "seed {seed}, {}: tables differ", shape.name);
            // With parking, a re-sent event of a parked aggregate is held or a duplicate
            // by where the batches are cut, as the parking test says; the tables agree.
            if !poison {
                assert_eq!(outcomes, per_event, "seed {seed}, {}: outcomes differ", shape.name);
            }
            assert_eq!(dead_lettered(&pool, shape.name).await, per_event_letters, "seed {seed}, {}", shape.name);
            *folded.entry(shape.name).or_default() += n;
        }
    }
    // Every shape folds but the one with a custom table (written by its own SQL).
    for shape in ["transition_only", "upsert_only", "fan_in_only", "mixed", "deleting", "keyed"] {
        assert!(folded[shape] > 10, "{shape} folded too few batches: {folded:?}");
    }
    assert_eq!(folded["custom_mix"], 0, "custom_mix folded: {folded:?}");
    // A projection whose rows fold across batches, on the same streams.
    migrate(&pool, &[&Tallies as &dyn PgProjection]).await.unwrap();
    let mut tallied = 0;
    for seed in 0..12 {
        let (poison, policy) = if seed % 3 == 2 { (true, Policy::default()) } else { (false, Policy::HALT) };
        let stream = random_stream(seed, poison);
        let stream = if poison { stream } else { gap_free(&stream) };
        let (per_event, per_event_tables) = run(&pool, &Tallies, &stream, (Mode::PerEvent, policy), seed).await;
        let per_event_letters = dead_lettered(&pool, "tallies").await;
        let (outcomes, tables, n) = run_folded(&pool, &Tallies, &stream, policy, (seed + 300, 80)).await;
        assert_eq!(tables, per_event_tables, "seed {seed}, tallies: tables differ");
        assert_eq!(dead_lettered(&pool, "tallies").await, per_event_letters, "seed {seed}, tallies");
        if !poison {
            assert_eq!(outcomes, per_event, "seed {seed}, tallies: outcomes differ");
        }
        tallied += n;
    }
    assert!(tallied > 30, "tallies folded {tallied} batches");
    // The event a parked aggregate waits for, in a batch that would fold: it resumes the
    // aggregate, whose held event then applies, as one event at a time.
    let e = |id: &str, v, n| envelope(THING, id, v, &Wire::Add { n });
    let stream = [e("a1", 1, 1), e("a2", 1, 1), e("a1", 3, 4), e("a2", 2, 1), e("a1", 2, 2), e("a2", 3, 1)];
    let (_, per_event_tables) = run(&pool, &Tallies, &stream, (Mode::PerEvent, Policy::default()), 0).await;
    for max_batch in [1, 2] {
        let (_, tables, _) = run_folded(&pool, &Tallies, &stream, Policy::default(), (7, max_batch)).await;
        assert_eq!(tables, per_event_tables, "batches of at most {max_batch}: a1 resumed and drained");
    }
    // The bench's projection: every batch folds, rows held across many of them.
    let bank = bank_accounts::BankAccounts;
    migrate(&pool, &[&bank as &dyn PgProjection]).await.unwrap();
    for seed in 0..3 {
        let stream = with_redeliveries(&bank_accounts::generate::stream(30, 40, seed), 0.1, 0.05, seed);
        let (batched, tables) = run(&pool, &bank, &stream, (Mode::Batch, Policy::HALT), seed).await;
        let (outcomes, folded_tables, n) = run_folded(&pool, &bank, &stream, Policy::HALT, (seed, 80)).await;
        assert_eq!(folded_tables, tables, "seed {seed}: bank accounts differ");
        assert_eq!(outcomes, batched, "seed {seed}: bank accounts' outcomes differ");
        assert!(n > stream.len() / 80, "seed {seed}: {n} batches folded");
    }
    // A read model that shrinks and nests: orders deleted, their lines cleared, customers'
    // totals fed by many orders, folded across batches (rows made, deleted and made again).
    let orders = order_status::OrderStatus;
    migrate(&pool, &[&orders as &dyn PgProjection]).await.unwrap();
    for seed in 0..3 {
        let stream = with_redeliveries(&order_status::generate::stream(100, 8, seed), 0.1, 0.05, seed);
        let (batched, tables) = run(&pool, &orders, &stream, (Mode::Batch, Policy::HALT), seed).await;
        let (outcomes, folded_tables, n) = run_folded(&pool, &orders, &stream, Policy::HALT, (seed, 80)).await;
        assert_eq!(folded_tables, tables, "seed {seed}: orders differ");
        assert_eq!(outcomes, batched, "seed {seed}: orders' outcomes differ");
        assert!(n > stream.len() / 80, "seed {seed}: {n} batches folded");
    }
}

/// Snaps of `refused` are values `wm_snaps` refuses, as a CHECK constraint a projection's
/// author added would (`wm_counts` takes them, and refuses only a NUL, as text does: a table
/// without a CHECK constraint): found by PostgreSQL, in a batch, in its per-event fallback,
/// or as a held event drains.
const REFUSED: &str = "ALTER TABLE wm_snaps ADD CONSTRAINT wm_snaps_not_refused CHECK (state <> 'refused')";

/// The whole stream as one batch, set-based, gaps parked.
async fn run_whole(
    pool: &PgPool,
    projection: &dyn PgProjection,
    stream: &[RawEnvelope],
) -> (Vec<Outcome>, serde_json::Value) {
    emptied(pool, projection).await;
    let outcomes = apply_batch_in(pool, projection, stream, Mode::Batch, Policy::default()).await.unwrap();
    (outcomes, dump_tables(pool, projection).await)
}

#[sqlx::test(migrations = false)]
async fn set_based_batches_equal_the_per_event_path_on_random_streams(pool: PgPool) {
    let projections: Vec<&dyn PgProjection> = SHAPES.iter().map(|s| s as &dyn PgProjection).collect();
    migrate(&pool, &projections).await.unwrap();
    let mut seen = HashMap::new();
    for seed in 0..12 {
        let stream = random_stream(seed, false);
        for shape in &SHAPES {
            let halt = Policy::HALT;
            let (per_event, per_event_tables) = run(&pool, shape, &stream, (Mode::PerEvent, halt), seed).await;
            let (batched, batched_tables) = run(&pool, shape, &stream, (Mode::Batch, halt), seed + 100).await;
            assert_eq!(batched.len(), stream.len());
            for (i, (b, p)) in batched.iter().zip(&per_event).enumerate() {
                assert_eq!(
                    b, p,
                    "seed {seed}, {}: event #{i} ({} v{} {})",
                    shape.name, stream[i].aggregate_id, stream[i].version, stream[i].event_type
                );
            }
            assert_eq!(batched_tables, per_event_tables, "seed {seed}, {}: tables differ", shape.name);
            for o in &batched {
                *seen.entry((shape.name, o.label())).or_insert(0) += 1;
            }
            if shape.name == "transition_only" {
                let rows: Vec<(String, i64, i64)> =
                    sqlx::query_as("SELECT id, total, version FROM wm_counts").fetch_all(&pool).await.unwrap();
                let got: HashMap<String, (i64, i64)> = rows.into_iter().map(|(id, t, v)| (id, (t, v))).collect();
                assert_eq!(got, expected_totals(&stream), "seed {seed}: totals against the oracle");
            }
        }
    }
    // The streams exercised every outcome of every shape (upserts have no gaps).
    for shape in &SHAPES {
        for label in ["applied", "duplicate", "stale", "ignored", "gap"] {
            if !(shape.name == "upsert_only" && label == "gap") {
                assert!(
                    seen.get(&(shape.name, label)).copied().unwrap_or(0) > 0,
                    "{} never saw {label}: {seen:?}",
                    shape.name
                );
            }
        }
    }
}

#[sqlx::test(migrations = false)]
async fn two_writers_applying_overlapping_batches_apply_each_event_once(pool: PgPool) {
    migrate(&pool, &[&OrderStatus]).await.unwrap();
    let events = order_status::generate::stream(300, 15, 3);
    let clean: u64 =
        apply_batch(&pool, &OrderStatus, &events).await.unwrap().iter().filter(|o| **o == Outcome::Applied).count()
            as u64;
    let expected = dump_tables(&pool, &OrderStatus).await;

    let wide = PgPoolOptions::new().max_connections(4).connect_with((*pool.connect_options()).clone()).await.unwrap();
    for round in 0..3_usize {
        reset(&pool, &OrderStatus).await.unwrap();
        let events = Arc::new(events.clone());
        // The same partition applied by two processes at once (a zombie during a
        // rebalance), with different batch boundaries, both from the start.
        let writers: Vec<_> = [40 + round * 7, 65 + round * 11]
            .into_iter()
            .map(|size| {
                let (wide, events) = (wide.clone(), events.clone());
                tokio::spawn(async move {
                    let mut applied = 0_u64;
                    for batch in events.chunks(size) {
                        // As the engine does: a deadlock between the two rolls one back whole,
                        // and it is tried again.
                        let mut tries = 0;
                        let outcomes = loop {
                            match apply_batch(&wide, &OrderStatus, batch).await {
                                Err(e) if e.is_retryable() && tries < 20 => tries += 1,
                                other => break other.expect("only retryable errors, and not for ever"),
                            }
                        };
                        assert!(outcomes.iter().all(Outcome::is_ok), "{outcomes:?}");
                        applied += outcomes.iter().filter(|o| **o == Outcome::Applied).count() as u64;
                    }
                    applied
                })
            })
            .collect();
        let mut applied = 0;
        for w in writers {
            applied += w.await.unwrap();
        }
        assert_eq!(applied, clean, "round {round}: every event applied exactly once across both writers");
        assert_eq!(
            dump_tables(&pool, &OrderStatus).await,
            expected,
            "round {round}: the read model equals the clean run"
        );
    }
}

#[sqlx::test(migrations = false)]
async fn writes_and_custom_sql_mix_in_one_batch(pool: PgPool) {
    let e = |v, w: Wire| envelope("thing", "n1", v, &w);
    // Adds through planned writes, snaps through custom SQL (its `apply` has no guard).
    let custom_mix = Shaped { name: "custom_mix", tables: &[COUNTS, BUCKETS, NOTES] };
    ProjectionTest::new(pool, custom_mix)
        .when([
            e(1, Wire::Add { n: 5 }),
            e(2, Wire::Snap { s: "half".into() }),
            e(3, Wire::Add { n: 7 }),
            e(2, Wire::Snap { s: "again".into() }),
            e(4, Wire::Noise {}),
            e(5, Wire::Add { n: 1 }),
        ])
        .then_outcomes([
            Outcome::Applied,
            Outcome::Applied,
            Outcome::Applied,
            Outcome::Stale,
            Outcome::Ignored,
            Outcome::Applied,
        ])
        .then_rows(
            "SELECT id, total, last, version FROM wm_counts",
            json!([{"id": "n1", "total": 13, "last": "add 1", "version": 5}]),
        )
        .then_rows("SELECT body FROM wm_notes", json!([{"body": "half"}]))
        .run()
        .await;
}

/// Writes `events` as one batch of `projection` read from partition 0 of `topic`, in the
/// caller's transaction, as the engine does (parked aggregates read first).
async fn write_in(conn: &mut PgConnection, projection: &Shaped, events: Vec<RawEnvelope>) {
    let messages: Vec<SourceMessage> =
        events.iter().map(|e| SourceMessage { payload: e.to_json(), ..SourceMessage::default() }).collect();
    let mut prepared = projection.prepare(events);
    prepared.set_source(Source { topic: "t".into(), messages, ..Source::default() });
    projectionist::postgres::writer::write(conn, projection, &prepared, Mode::Batch, projectionist::OnGap::Park)
        .await
        .unwrap();
}

/// The deadlock CI once met: a batch had read its parked aggregates, the swap took the live
/// table, wanted the parked ones, and the batch then wanted the live table.
#[sqlx::test(migrations = false)]
async fn a_swap_waits_for_a_batch_in_flight_whatever_the_batch_locks_next(pool: PgPool) {
    use projectionist::postgres::rebuild::{self, Swap};
    static COUNTED: Shaped = Shaped { name: "swap_counts", tables: &[COUNTS] };
    migrate(&pool, &[&COUNTED]).await.unwrap();
    rebuild::prepare(&pool, &COUNTED).await.unwrap();
    // A batch in flight: it has read its parked aggregates, met an event it writes nothing
    // for, and goes on.
    let mut tx = pool.begin().await.unwrap();
    write_in(&mut tx, &COUNTED, vec![envelope(OTHER, "o1", 1, &Wire::Add { n: 3 })]).await;
    let swapped = std::sync::atomic::AtomicBool::new(false);
    let swap = async {
        let done = rebuild::swap(&pool, &COUNTED, &[]).await;
        swapped.store(true, std::sync::atomic::Ordering::SeqCst);
        done
    };
    let batch = async {
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        assert!(!swapped.load(std::sync::atomic::Ordering::SeqCst), "the swap waits for the batch in flight");
        // The batch now writes the live table: a lock it had not taken when the swap came.
        write_in(&mut tx, &COUNTED, vec![envelope(THING, "a1", 1, &Wire::Add { n: 3 })]).await;
        tx.commit().await.unwrap();
    };
    let (done, ()) = tokio::time::timeout(std::time::Duration::from_secs(20), async { tokio::join!(swap, batch) })
        .await
        .expect("swapped in time");
    assert!(matches!(done, Ok(Swap::Done)), "the swap goes through once the batch has committed: {done:?}");
    // The batch wrote the table that was live while it ran; the shadow's (empty) is live now.
    let count = |table: &'static str| {
        let pool = pool.clone();
        async move {
            let sql = format!("SELECT count(*) FROM {table}");
            sqlx::query_scalar::<_, i64>(&sql).fetch_one(&pool).await.unwrap()
        }
    };
    assert_eq!(count("wm_counts").await, 0);
    assert_eq!(count("projectionist_old_swap_counts.wm_counts").await, 1);
}

/// Two partitions' batches writing the same fan-in rows in opposite orders (one event at a
/// time, as after a refused set-based statement), released together: each batch locks the
/// fan-in rows it writes in one order before writing anything, so one waits for the other
/// instead of both deadlocking (which they did on every retry in the bench's orders arm).
#[sqlx::test(migrations = false)]
async fn batches_writing_shared_fan_in_rows_in_opposite_orders_wait_instead_of_deadlocking(pool: PgPool) {
    use order_status::OrderEvent;
    migrate(&pool, &[&OrderStatus]).await.unwrap();
    let placed = |order: &str, customer: &str| {
        envelope("order", order, 1, &OrderEvent::OrderPlaced { customer_id: customer.into(), total_cents: 100 })
    };
    apply_batch(&pool, &OrderStatus, &[placed("o-0", "k1"), placed("o-00", "k2")]).await.unwrap();
    // Both customers' rows held by a third transaction, so that the two batches start together.
    let mut holder = pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM customer_order_stats FOR UPDATE").execute(&mut *holder).await.unwrap();
    let wide = PgPoolOptions::new().max_connections(4).connect_with((*pool.connect_options()).clone()).await.unwrap();
    let batch = |events: Vec<RawEnvelope>| {
        let wide = wide.clone();
        tokio::spawn(async move { apply_batch_in(&wide, &OrderStatus, &events, Mode::PerEvent, Policy::HALT).await })
    };
    let a = batch(vec![placed("o-a1", "k1"), placed("o-a2", "k2")]);
    let b = batch(vec![placed("o-b1", "k2"), placed("o-b2", "k1")]);
    let waiting = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'",
        )
        .fetch_one(&pool)
        .await
        .unwrap()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while waiting().await < 2 {
        assert!(std::time::Instant::now() < deadline, "both batches wait for the holder");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    holder.commit().await.unwrap();
    for (name, batch) in [("a", a), ("b", b)] {
        let outcomes = batch.await.unwrap().unwrap_or_else(|e| panic!("batch {name}: {e}"));
        assert_eq!(outcomes, [Outcome::Applied; 2], "batch {name}");
    }
    let stats: Vec<(String, i64)> =
        sqlx::query_as("SELECT customer_id, orders_placed FROM customer_order_stats ORDER BY customer_id")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(stats, [("k1".to_owned(), 3), ("k2".to_owned(), 3)]);
}

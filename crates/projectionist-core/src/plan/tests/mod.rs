use super::*;
use crate::test_types::TestTypes;

fn owned(values: &[&Value]) -> Vec<Value> {
    values.iter().map(|v| (*v).clone()).collect()
}
use crate::Envelope;

/// Deletes, clears and the versions they keep.
mod deletes;

const ACC: Table =
    Table::transition("acc", "id").aggregate_type("account").columns(&[("balance", "bigint"), ("owner", "text")]);
const SNAP: Table = Table::upsert("snap", "id").aggregate_type("account").columns(&[("owner", "text")]);
const STATS: Table = Table::fan_in("stats", "customer").columns(&[("n", "bigint")]);

fn env(id: &str, version: i64) -> Envelope<()> {
    Envelope::for_test("account", id, version)
}

fn r(id: &str, version: i64) -> EventRef<'static> {
    EventRef { aggregate_type: "account", aggregate_id: Box::leak(id.to_owned().into_boxed_str()), version }
}

#[test]
fn a_column_not_declared_surely_takes_nothing() {
    let declared = Declared::of(&ACC, &TestTypes);
    let missing = declared.column("missing");
    assert!(!missing.surely_fits(&Value::from(1)) && !missing.surely_fits(&Value::Null));
    assert!(missing.int_range().is_none() && !missing.chains_exactly() && !missing.required());
    let big = crate::plan::IntRange { min: i64::MIN.into(), max: i64::MAX.into() };
    assert_eq!(declared.column("balance").int_range(), Some(big), "a declared one");
}

#[test]
fn a_state_between_that_postgres_could_refuse_is_not_coalesced_away() {
    use serde_json::json;
    const T: Table = Table::transition("t", "id").aggregate_type("account").columns(&[
        ("owner", "text"),
        ("x", "text NOT NULL"),
        ("d", "numeric(4,2) NOT NULL DEFAULT 0"),
        ("n", "bigint NOT NULL DEFAULT 0"),
    ]);
    let plan_of = |writes: &[Vec<Write>]| {
        let events: Vec<(EventRef<'_>, Effect<'_>)> =
            writes.iter().enumerate().map(|(i, w)| (r("a", i as i64 + 1), Effect::Writes(w))).collect();
        let p = plan(&[T], &TestTypes, &Stored::default(), &events).unwrap();
        (p.rows.iter().map(|r| r.kind).collect::<Vec<_>>(), p.superseded)
    };
    // NOT NULL without a default: v1's insert without `x` is refused alone, v2 not folded in.
    let (kinds, _) =
        plan_of(&[vec![T.write(&env("a", 1)).set("owner", "o")], vec![T.write(&env("a", 2)).set("x", "y")]]);
    assert_eq!(kinds, vec![RowKind::Insert, RowKind::Update]);
    let (kinds, _) = plan_of(&[vec![T.write(&env("a", 1)).set("x", "o")], vec![T.write(&env("a", 2)).set("x", "y")]]);
    assert_eq!(kinds, vec![RowKind::Insert], "x set by the insert: folded");
    // numeric(4,2): 50 + 60 overflows one event at a time, whatever follows: in rounds.
    let adds = |first: Write| {
        vec![vec![first], vec![T.write(&env("a", 2)).add("d", 60)], vec![T.write(&env("a", 3)).add("d", -60)]]
    };
    let (_, superseded) = plan_of(&adds(T.write(&env("a", 1)).set("x", "o").set("d", json!(50))));
    assert_eq!(superseded, vec![T], "a numeric(p, s) chain is written step by step");
    let (_, superseded) = plan_of(&adds(T.write(&env("a", 1)).set("x", "o").add("d", json!(50))));
    assert_eq!(superseded, vec![T], "adds after an add too");
    let ints = |c| vec![vec![T.write(&env("a", 1)).set("x", "o").add(c, 5)], vec![T.write(&env("a", 2)).add(c, 6)]];
    assert!(plan_of(&ints("n")).1.is_empty(), "integers: summed, each step's range checked by the writer");
}

#[test]
fn a_value_that_might_be_refused_written_over_names_its_table() {
    let w1 = [ACC.write(&env("a", 1)).set("owner", "nul\u{0}")];
    let w2 = [ACC.write(&env("a", 2)).set("owner", "ann")];
    let w3 = [ACC.write(&env("a", 3)).set("owner", "bob")];
    let events = [(r("a", 1), Effect::Writes(&w1)), (r("a", 2), Effect::Writes(&w2)), (r("a", 3), Effect::Writes(&w3))];
    let p = plan(&[ACC], &TestTypes, &Stored::default(), &events).unwrap();
    assert_eq!(p.superseded, vec![ACC], "the NUL is written over in the insert");
    let p = plan(&[ACC], &TestTypes, &Stored::default(), &events[1..]).unwrap();
    assert!(p.superseded.is_empty(), "ann surely fits text: {p:?}");
    let adds = [ACC.write(&env("a", 2)).add("balance", 5)];
    let set = [ACC.write(&env("a", 3)).set("balance", 0)];
    let mut stored = Stored::default();
    stored.rows.insert("acc", Versions::from_iter([("a", 1)]));
    let events = [(r("a", 2), Effect::Writes(&adds)), (r("a", 3), Effect::Writes(&set))];
    assert_eq!(plan(&[ACC], &TestTypes, &stored, &events).unwrap().superseded, vec![ACC], "adds never summed");
}

#[test]
fn rows_written_twice_are_named_and_rounds_cut_before_a_checked_row_is_written_again() {
    let a1 = [ACC.write(&env("a", 1)).add("balance", 1), STATS.row("c").add("n", 1)];
    let b1 = [ACC.write(&env("b", 1)).add("balance", 1), STATS.row("c").add("n", 1)];
    let a2 = [ACC.write(&env("a", 2)).add("balance", -5)];
    let b2 = [ACC.write(&env("b", 2)).add("balance", 5)];
    let events = [
        (r("a", 1), Effect::Writes(&a1)),
        (r("b", 1), Effect::Writes(&b1)),
        (r("a", 2), Effect::Writes(&a2)),
        (r("b", 2), Effect::Writes(&b2)),
        (r("c", 1), Effect::Ignored),
    ];
    let p = plan(&[ACC, STATS], &TestTypes, &Stored::default(), &events).unwrap();
    assert!(p.rewritten.len() == 2 && p.rewritten.contains(&ACC) && p.rewritten.contains(&STATS), "{p:?}");
    assert_eq!(rounds(&events, &[ACC]), vec![2], "a and b again: a second round");
    assert_eq!(rounds(&events, &[STATS]), vec![1], "stats/c again at once");
    assert_eq!(rounds(&events, &[ACC, STATS]), vec![1, 3], "stats/c, then b");
    assert!(rounds(&events, &[SNAP]).is_empty(), "an unwritten table cuts nothing");
    let once = plan(&[ACC, STATS], &TestTypes, &Stored::default(), &events[..1]).unwrap();
    assert!(once.rewritten.is_empty());
}

#[test]
fn coalesces_a_chain_into_one_write_per_row() {
    let w1 = [ACC.write(&env("a", 1)).set("owner", "ann").add("balance", 100)];
    let w2 = [ACC.write(&env("a", 2)).add("balance", 50)];
    let w3 = [ACC.write(&env("b", 4)).add("balance", -5)];
    let old = [ACC.write(&env("b", 2)).add("balance", 1000)];
    let w4 = [ACC.write(&env("b", 5)).add("balance", -5).set("owner", "bob")];
    let mut stored = Stored::default();
    stored.rows.insert("acc", Versions::from_iter([("b", 3)]));
    let events = [
        (r("a", 1), Effect::Writes(&w1)),
        (r("a", 1), Effect::Writes(&w1)),
        (r("b", 4), Effect::Writes(&w3)),
        (r("a", 2), Effect::Writes(&w2)),
        (r("b", 2), Effect::Writes(&old)),
        (r("b", 5), Effect::Writes(&w4)),
    ];
    let p = plan(&[ACC], &TestTypes, &stored, &events).unwrap();
    use Outcome::*;
    assert_eq!(p.outcomes, vec![Applied, Duplicate, Applied, Applied, Stale, Applied]);
    let cols =
        |r: &RowWrite| r.columns.iter().map(|c| (c.column, c.base.cloned(), owned(&c.deltas))).collect::<Vec<_>>();
    assert_eq!(p.rows.len(), 2);
    let a = &p.rows[0];
    assert_eq!((a.key, a.kind, a.expected, a.version), ("a", RowKind::Insert, None, Some(2)));
    assert_eq!(
        cols(a),
        vec![("owner", Some(Value::from("ann")), vec![]), ("balance", Some(Value::from(100)), vec![Value::from(50)])],
        "the creating event's add is absolute, the next one a delta folded in SQL"
    );
    let b = &p.rows[1];
    assert_eq!((b.key, b.kind, b.expected, b.version), ("b", RowKind::Update, Some(3), Some(5)));
    assert_eq!(
        cols(b),
        vec![("balance", None, vec![Value::from(-5), Value::from(-5)]), ("owner", Some(Value::from("bob")), vec![])]
    );
}

#[test]
fn an_add_to_a_column_the_insert_left_to_its_default_is_an_update() {
    let w1 = [ACC.write(&env("a", 1)).set("owner", "ann")];
    let w2 = [ACC.write(&env("a", 2)).add("balance", 5)];
    let events = [(r("a", 1), Effect::Writes(&w1)), (r("a", 2), Effect::Writes(&w2))];
    let p = plan(&[ACC], &TestTypes, &Stored::default(), &events).unwrap();
    let shape = p.rows.iter().map(|r| (r.kind, r.expected, r.version)).collect::<Vec<_>>();
    assert_eq!(shape, vec![(RowKind::Insert, None, Some(1)), (RowKind::Update, Some(1), Some(2))]);
    assert_eq!(owned(&p.rows[1].columns[0].deltas), vec![Value::from(5)]);
}

#[test]
fn an_event_moves_only_the_gates_its_aggregate_type_owns() {
    let customer = EventRef { aggregate_type: "customer", aggregate_id: "a", version: 3 };
    let w = [ACC.write(&env("a", 1)).set("owner", "ann")];
    let events = [(customer, Effect::Ignored), (r("a", 1), Effect::Writes(&w))];
    let p = plan(&[ACC], &TestTypes, &Stored::default(), &events).unwrap();
    assert_eq!(p.outcomes, vec![Outcome::Ignored, Outcome::Applied]);
    // Applied in `apply` with no custom table to gate it: its duplicates would apply again.
    assert!(plan(&[ACC], &TestTypes, &Stored::default(), &[(customer, Effect::Custom)]).is_err());
    assert_eq!((p.rows.len(), p.rows[0].version), (1, Some(1)));
    let wrong = [ACC.write(&env("a", 3))];
    let err = plan(&[ACC], &TestTypes, &Stored::default(), &[(customer, Effect::Writes(&wrong))]).unwrap_err();
    assert!(err.problem.contains("holds aggregates of type [\"account\"], not \"customer\""), "{err}");
}

#[test]
fn an_ignored_event_moves_the_gate_and_a_gap_stops_nothing_else() {
    let w3 = [ACC.write(&env("a", 3)).add("balance", 1)];
    let mut stored = Stored::default();
    stored.rows.insert("acc", Versions::from_iter([("a", 1)]));
    let events = [
        (r("a", 2), Effect::Ignored),
        (r("a", 3), Effect::Writes(&w3)),
        (r("a", 5), Effect::Ignored),
        (r("z", 2), Effect::Writes(&[])),
    ];
    let p = plan(&[ACC], &TestTypes, &stored, &events).unwrap();
    assert_eq!(
        p.outcomes,
        vec![
            Outcome::Ignored,
            Outcome::Applied,
            Outcome::Gap { expected: 4, found: 5 },
            Outcome::Gap { expected: 1, found: 2 }
        ]
    );
    assert_eq!((p.rows[0].expected, p.rows[0].version), (Some(1), Some(3)));
}

#[test]
fn a_parking_whose_version_was_applied_elsewhere_resumes_before_the_event() {
    // Parked waiting for 2, but v2 was applied since (on another partition): the plan
    // ends before a4, resuming the aggregate so that its held events apply first.
    let (b1, a4) = ([ACC.write(&env("b", 1))], [ACC.write(&env("a", 4)).add("balance", 4)]);
    let key = ("account".to_owned(), "a".to_owned());
    let mut stored = Stored::default();
    stored.rows.insert("acc", Versions::from_iter([("a", 2)]));
    stored.parked = Some(HashMap::from([(key.clone(), super::Parked { waiting_for: 2, dead_letter: false })]));
    let events = [(r("b", 1), Effect::Writes(&b1)), (r("a", 4), Effect::Writes(&a4))];
    let p = plan(&[ACC], &TestTypes, &stored, &events).unwrap();
    assert_eq!(p.outcomes, vec![Outcome::Applied], "b1, then the plan ends before a4");
    assert_eq!((p.unparked, p.parks), (Some(key.clone()), vec![(key.clone(), None)]));
    // Still waiting (the row at 1): a4 is held as before.
    stored.rows.insert("acc", Versions::from_iter([("a", 1)]));
    let p = plan(&[ACC], &TestTypes, &stored, &events).unwrap();
    assert_eq!((p.outcomes, p.unparked), (vec![Outcome::Applied, Outcome::Parked], None));
}

#[test]
fn with_parking_a_gap_parks_its_aggregate_and_the_awaited_version_ends_the_plan() {
    let w = |id: &str, v: i64| vec![ACC.write(&env(id, v)).add("balance", v)];
    let (a2, a3, a4, b1) = (w("a", 2), w("a", 3), w("a", 4), w("b", 1));
    let mut stored = Stored { parked: Some(HashMap::new()), ..Stored::default() };
    stored.rows.insert("acc", Versions::from_iter([("a", 1)]));
    let events = [
        (r("a", 3), Effect::Writes(&a3)),
        (r("a", 4), Effect::Writes(&a4)),
        (r("b", 1), Effect::Writes(&b1)),
        (r("a", 2), Effect::Writes(&a2)),
        (r("b", 2), Effect::Writes(&[])),
    ];
    let p = plan(&[ACC], &TestTypes, &stored, &events).unwrap();
    use Outcome::*;
    assert_eq!(p.outcomes, vec![Parked, Parked, Applied, Applied], "the plan ends after a2");
    let key = ("account".to_owned(), "a".to_owned());
    assert_eq!(p.unparked, Some(key.clone()));
    assert_eq!(p.parks, vec![(key.clone(), None)], "parked, then resumed within the plan");
    let rows = p.rows.iter().map(|r| (r.key, r.expected, r.version)).collect::<Vec<_>>();
    assert_eq!(rows, vec![("b", None, Some(1)), ("a", Some(1), Some(2))], "a3 and a4 are held, not written");

    // Parked before the plan, waiting for 5: later versions are held, earlier ones
    // classified as ever; a gap below the awaited version lowers it.
    let mut parked = stored.clone();
    parked.rows.insert("acc", Versions::from_iter([("a", 2)]));
    parked.parked = Some(HashMap::from([(key.clone(), super::Parked { waiting_for: 5, dead_letter: false })]));
    let events = [(r("a", 6), Effect::Ignored), (r("a", 3), Effect::Writes(&a3)), (r("a", 5), Effect::Ignored)];
    let p = plan(&[ACC], &TestTypes, &parked, &events).unwrap();
    assert_eq!(p.outcomes, vec![Parked, Applied, Parked]);
    let waiting = super::Parked { waiting_for: 4, dead_letter: false };
    assert_eq!((p.unparked, p.parks), (None, vec![(key.clone(), Some(waiting))]));

    // A poison event where it would apply is dead-lettered and parks its aggregate behind
    // it, the same version re-sent included; a version already applied is a duplicate.
    let events = [
        (r("a", 1), Effect::Poison),
        (r("a", 2), Effect::Poison),
        (r("a", 2), Effect::Writes(&a2)),
        (r("a", 3), Effect::Writes(&a3)),
    ];
    let p = plan(&[ACC], &TestTypes, &stored, &events).unwrap();
    assert_eq!(p.outcomes, vec![Duplicate, DeadLettered, Parked, Parked]);
    assert!(p.rows.is_empty());
    let behind = super::Parked { waiting_for: 2, dead_letter: true };
    assert_eq!((p.unparked, p.parks), (None, vec![(key, Some(behind))]));

    // Parking off: a gap is a gap.
    let events = [(r("a", 2), Effect::Ignored)];
    let p = plan(&[ACC], &TestTypes, &Stored::default(), &events).unwrap();
    assert_eq!((p.outcomes, p.parks.len()), (vec![Gap { expected: 1, found: 2 }], 0));
}

#[test]
fn upserts_skip_versions_and_fan_in_follows_the_aggregate_version() {
    let s1 = [SNAP.write(&env("a", 2)).set("owner", "x"), STATS.row("c1").add("n", 1)];
    let s2 = [SNAP.write(&env("a", 1)).set("owner", "old"), STATS.row("c1").add("n", 1)];
    let events = [(r("a", 2), Effect::Writes(&s1)), (r("a", 2), Effect::Writes(&s1)), (r("a", 1), Effect::Writes(&s2))];
    let mut stored = Stored::default();
    stored.aggregates.insert(("account", "a"), 1);
    let p = plan(&[SNAP, STATS], &TestTypes, &stored, &events).unwrap();
    assert_eq!(p.outcomes, vec![Outcome::Applied, Outcome::Duplicate, Outcome::Stale]);
    assert_eq!(p.rows.len(), 2);
    assert_eq!(
        (p.rows[1].kind, owned(&p.rows[1].columns[0].deltas)),
        (RowKind::Merge, vec![Value::from(1)]),
        "counted once"
    );
    assert_eq!(
        p.aggregates,
        vec![AggregateWrite {
            aggregate_type: "account".into(),
            aggregate_id: "a".into(),
            expected: Some(1),
            version: 2
        }]
    );
}

#[test]
fn declarations_are_enforced_with_the_place_named() {
    let cases: Vec<(Vec<Write>, &str)> = vec![
        (vec![ACC.write(&env("a", 1)).set("nope", 1)], "declares no column \"nope\""),
        (vec![SNAP.write(&env("a", 1)).add("owner", 1)], "do not add"),
        (vec![STATS.write(&env("a", 1))], "use row(key)"),
        (vec![ACC.write(&env("other", 1))], "not the event being projected"),
        (vec![Table::transition("undeclared", "id").aggregate_type("account").write(&env("a", 1))], "not declared"),
        (vec![ACC.write(&env("a", 1)).add("balance", true)], "needs a number"),
        (vec![ACC.write(&env("a", 1)).add("balance", 1).set("balance", 2)], "changed twice"),
        (vec![STATS.row("k".repeat(crate::MAX_KEY_BYTES + 1))], "longer than"),
        (vec![ACC.write(&env("a", 1)).delete()], "declared .deletable()"),
        (vec![STATS.row("c").add("n", 1).delete()], "sets no column"),
        (vec![STATS.child_row(&env("a", 1), "x")], "not a child table"),
        (vec![LINES.row("x")], "holds child rows"),
        (vec![LINES.clear(&env("a", 1)).set("n", 1)], "sets no column"),
        (vec![LINES.child_row(&env("b", 1), "x")], "its own aggregate's children"),
        (vec![DAILY.row("2026-11-27")], "use row_keys(a, b)"),
        (vec![STATS.row_keys("a", "b")], "use row(key)"),
        (vec![DAILY.row_keys("2026-11-27 00:00", "EUR")], "not a date in its canonical form"),
        (vec![DAILY.row_keys("2026-02-30", "EUR")], "not a date"),
        (vec![BY_N.row("07")], "not a bigint in its canonical form"),
        (vec![ACC.row_keys("a", "b")], "takes a fan-in table of two keys"),
    ];
    const DAILY: Table = Table::fan_in_keys("daily", &[("day", "date"), ("currency", "text")]);
    const BY_N: Table = Table::fan_in_keys("by_n", &[("n", "bigint")]);
    const LINES: Table = Table::child("lines", "account_id", "sku").aggregate_type("account");
    for (writes, want) in cases {
        let tables = [ACC, SNAP, STATS, LINES, DAILY, BY_N];
        let err = plan(&tables, &TestTypes, &Stored::default(), &[(r("a", 1), Effect::Writes(&writes))]).unwrap_err();
        assert!(err.to_string().contains(want) && err.index == 0, "{err} / {want}");
    }
}

#[test]
fn events_whose_duplicates_could_not_be_told_apart_are_refused() {
    // A fan-in or custom table gates its writers by their aggregate's version, kept for
    // the types it declares: a writer of another type would count each redelivery.
    const NUMS: Table = Table::fan_in("nums", "k").aggregate_type("num").columns(&[("n", "bigint")]);
    const LOG: Table = Table::custom("log", "CREATE TABLE log (id text)").aggregate_type("num");
    let writes = [NUMS.row("k").add("n", 1)];
    let err = plan(&[NUMS], &TestTypes, &Stored::default(), &[(r("a", 1), Effect::Writes(&writes))]).unwrap_err();
    assert!(err.to_string().contains("not \"account\""), "{err}");
    let err = plan(&[LOG], &TestTypes, &Stored::default(), &[(r("a", 1), Effect::Custom)]).unwrap_err();
    assert!(err.to_string().contains("no custom or fan-in table declares that type"), "{err}");
    // Declared, both are gated: the redelivery is a duplicate.
    let events = [(r("a", 1), Effect::Custom), (r("a", 1), Effect::Custom)];
    let outcomes = plan(&[Table::custom("log", "").aggregate_type("account")], &TestTypes, &Stored::default(), &events);
    assert_eq!(outcomes.unwrap().outcomes, vec![Outcome::Applied, Outcome::Duplicate]);
}

#[test]
fn gates_that_disagree_and_keys_that_cannot_be_stored_are_errors() {
    let mut stored = Stored::default();
    stored.rows.insert("acc", Versions::from_iter([("a", 2)]));
    stored.aggregates.insert(("account", "a"), 1);
    let err = plan(&[ACC, STATS], &TestTypes, &stored, &[(r("a", 2), Effect::Ignored)]).unwrap_err();
    assert!(err.problem.contains("disagree") && err.disagreement, "{err}");
    let err = plan(&[ACC], &TestTypes, &Stored::default(), &[(r(&"k".repeat(2000), 1), Effect::Ignored)]).unwrap_err();
    assert!(err.problem.contains("aggregate_id is 2000 bytes long") && !err.disagreement, "{err}");
    let err = plan(&[ACC], &TestTypes, &Stored::default(), &[(r("a\0b", 1), Effect::Ignored)]).unwrap_err();
    assert!(err.problem.contains("NUL character"), "{err}");
}

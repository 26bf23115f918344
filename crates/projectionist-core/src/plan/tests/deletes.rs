//! The planner's deletes: a fan-in row deleted, a row made and deleted in one batch, a
//! deletable row's version kept, a clear of an aggregate's children.

use super::*;

#[test]
fn a_fan_in_row_deleted_drops_what_came_before_and_starts_again_after() {
    let (set, delete, add) = ([STATS.row("c").set("n", 5)], [STATS.row("c").delete()], [STATS.row("c").add("n", 2)]);
    let events = [
        (r("a", 1), Effect::Writes(&set)),
        (r("a", 2), Effect::Writes(&delete)),
        (r("a", 3), Effect::Writes(&add)),
        (r("a", 2), Effect::Writes(&delete)),
    ];
    let p = plan(&[STATS], &TestTypes, &Stored::default(), &events).unwrap();
    assert_eq!(p.outcomes[3], Outcome::Stale, "a replayed delete after the re-creation");
    let rows: Vec<(RowKind, Vec<Value>)> =
        p.rows.iter().map(|r| (r.kind, r.columns.iter().flat_map(|c| owned(&c.deltas)).collect())).collect();
    assert_eq!(rows, vec![(RowKind::Delete, vec![]), (RowKind::Merge, vec![Value::from(2)])]);
    assert!(p.superseded.is_empty(), "a set that surely fits, dropped: nothing PostgreSQL would refuse");
    // Deleted last: only the delete is written.
    let p = plan(&[STATS], &TestTypes, &Stored::default(), &events[..2]).unwrap();
    assert_eq!(p.rows.iter().map(|r| r.kind).collect::<Vec<_>>(), vec![RowKind::Delete]);
    // An add dropped by the delete might have been refused (an overflow of what the row
    // holds): checked against the row as stored, nothing written, no rounds.
    let events = [(r("a", 1), Effect::Writes(&add)), (r("a", 2), Effect::Writes(&delete))];
    let p = plan(&[STATS], &TestTypes, &Stored::default(), &events).unwrap();
    let rows: Vec<(RowKind, Vec<Value>)> =
        p.rows.iter().map(|r| (r.kind, r.columns.iter().flat_map(|c| owned(&c.deltas)).collect())).collect();
    assert_eq!(rows, vec![(RowKind::Check, vec![Value::from(2)]), (RowKind::Delete, vec![])]);
    assert!(p.superseded.is_empty());
    // Once deleted in the batch, the row is new: its adds start from zero, summed here.
    let events =
        [(r("a", 1), Effect::Writes(&delete)), (r("a", 2), Effect::Writes(&add)), (r("a", 3), Effect::Writes(&delete))];
    let p = plan(&[STATS], &TestTypes, &Stored::default(), &events).unwrap();
    assert_eq!((p.rows.iter().map(|r| r.kind).collect::<Vec<_>>(), p.superseded), (vec![RowKind::Delete], vec![]));
    // An add to the stored row that a later set replaced, then the row deleted: the add
    // alone could overflow what the row holds; no check can stand for it, so in rounds.
    let events =
        [(r("a", 1), Effect::Writes(&add)), (r("a", 2), Effect::Writes(&set)), (r("a", 3), Effect::Writes(&delete))];
    assert_eq!(plan(&[STATS], &TestTypes, &Stored::default(), &events).unwrap().superseded, vec![STATS]);
    // Unless a step leaves the column's range: in rounds.
    let big = [STATS.row("c").add("n", i64::MAX)];
    let events = [
        (r("a", 1), Effect::Writes(&delete)),
        (r("a", 2), Effect::Writes(&big)),
        (r("a", 3), Effect::Writes(&big)),
        (r("a", 4), Effect::Writes(&delete)),
    ];
    assert_eq!(plan(&[STATS], &TestTypes, &Stored::default(), &events).unwrap().superseded, vec![STATS]);
}

#[test]
fn a_row_made_and_deleted_in_the_batch_is_checked_in_memory_where_its_values_are_known() {
    const ORDERS: Table = Table::transition("orders", "id")
        .aggregate_type("account")
        .columns(&[("paid", "bigint"), ("late", "bigint")])
        .deletable();
    let (placed, paid, late, gone) = (
        [ORDERS.write(&env("a", 1)).set("paid", 0)],
        [ORDERS.write(&env("a", 2)).add("paid", 5)],
        [ORDERS.write(&env("a", 3)).add("late", 1)],
        [ORDERS.write(&env("a", 4)).delete()],
    );
    let events = [
        (r("a", 1), Effect::Writes(&placed)),
        (r("a", 2), Effect::Writes(&paid)),
        (r("a", 3), Effect::Writes(&[])),
        (r("a", 4), Effect::Writes(&gone)),
    ];
    let p = plan(&[ORDERS], &TestTypes, &Stored::default(), &events).unwrap();
    assert!(p.superseded.is_empty() && p.rows.is_empty(), "0 + 5 fits: nothing to check, nothing written");
    // An add to a column the creating event left to its default: not known here.
    let events = [
        (r("a", 1), Effect::Writes(&placed)),
        (r("a", 2), Effect::Writes(&[])),
        (r("a", 3), Effect::Writes(&late)),
        (r("a", 4), Effect::Writes(&gone)),
    ];
    assert_eq!(plan(&[ORDERS], &TestTypes, &Stored::default(), &events).unwrap().superseded, vec![ORDERS]);
}

#[test]
fn a_deletable_row_deleted_keeps_its_version_in_the_aggregate_version_and_a_later_write_makes_it_again() {
    const LEDGER: Table =
        Table::transition("ledger", "id").aggregate_type("account").columns(&[("n", "bigint")]).deletable();
    let (delete, add, none) = ([LEDGER.write(&env("a", 4)).delete()], [LEDGER.write(&env("a", 6)).add("n", 2)], []);
    let events = [
        (r("a", 4), Effect::Writes(&delete)),
        (r("a", 5), Effect::Writes(&none)),
        (r("a", 6), Effect::Writes(&add)),
        (r("a", 2), Effect::Writes(&none)),
    ];
    let mut stored = Stored::default();
    stored.rows.insert("ledger", Versions::from_iter([("a", 3)]));
    let p = plan(&[LEDGER], &TestTypes, &stored, &events).unwrap();
    assert_eq!(p.outcomes, vec![Outcome::Applied, Outcome::Applied, Outcome::Applied, Outcome::Stale]);
    let rows: Vec<_> = p.rows.iter().map(|r| (r.kind, r.expected, r.version)).collect();
    assert_eq!(rows, vec![(RowKind::Delete, Some(3), None), (RowKind::Insert, None, Some(6))]);
    assert_eq!((p.aggregates[0].expected, p.aggregates[0].version), (None, 6), "kept from where the row stood");
    // Deleted and not written again: only the delete; v5 moves the aggregate's version alone.
    let p = plan(&[LEDGER], &TestTypes, &stored, &events[..2]).unwrap();
    assert_eq!(p.rows.iter().map(|r| r.kind).collect::<Vec<_>>(), vec![RowKind::Delete]);
    assert_eq!(p.aggregates[0].version, 5);
}

#[test]
fn a_clear_drops_the_aggregates_children_written_before_it_and_is_written_first() {
    const LINES: Table =
        Table::child("lines", "account_id", "sku").aggregate_type("account").columns(&[("note", "text")]);
    let e = |v| env("a", v);
    let (w1, w2) = ([LINES.child_row(&e(1), "x").set("note", "one")], [LINES.clear(&e(2))]);
    let w3 = [LINES.child_row(&e(3), "y").set("note", "three")];
    let other = [LINES.child_row(&env("b", 1), "x").set("note", "b")];
    let events = [
        (r("a", 1), Effect::Writes(&w1)),
        (r("b", 1), Effect::Writes(&other)),
        (r("a", 2), Effect::Writes(&w2)),
        (r("a", 3), Effect::Writes(&w3)),
    ];
    let p = plan(&[LINES], &TestTypes, &Stored::default(), &events).unwrap();
    let rows: Vec<_> = p.rows.iter().map(|r| (r.kind, r.key, r.child)).collect();
    assert_eq!(
        rows,
        vec![(RowKind::Clear, "a", None), (RowKind::Merge, "a", Some("y")), (RowKind::Merge, "b", Some("x"))],
        "a's x dropped by the clear, b's kept"
    );
    // In rounds, a clear after a child of its aggregate starts a new round (another
    // aggregate's child does not), and a child after the clear stays in its round.
    assert_eq!(rounds(&events, &[LINES]), vec![2]);
}

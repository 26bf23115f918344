use super::*;
use crate::plan::{plan, Effect, EventRef, Stored};
use crate::test_types::TestTypes;
use crate::{Envelope, Write};

const ORDERS: Table = Table::transition("orders", "id").aggregate_type("order").columns(&[("n", "bigint")]).deletable();
const LINES: Table =
    Table::child("lines", "order_id", "sku").aggregate_type("order").columns(&[("q", "bigint NOT NULL DEFAULT 0")]);
const TABLES: [Table; 2] = [ORDERS, LINES];

fn env(id: &str, version: i64) -> Envelope<()> {
    Envelope::for_test("order", id, version)
}

/// Plans one batch, an event per item, against what `fold` says (and, for the rows it
/// holds nothing of, `table`: order id → version), as a rebuild reads, and absorbs it.
fn fold_in(fold: &mut Fold, table: &[(&str, i64)], batch: &[(&str, i64, Vec<Write>)]) -> Vec<Outcome> {
    let mut stored = Stored::default();
    for (id, ..) in batch {
        let version = match fold.version("orders", id) {
            Some(folded) => folded,
            None => table.iter().find(|(t, _)| t == id).map(|(_, v)| *v),
        };
        if let Some(v) = version {
            stored.rows.entry("orders").or_default().insert(*id, v);
        }
        if let Some(v) = fold.aggregate("order", id) {
            stored.aggregates.insert(("order", *id), v);
        }
    }
    let events: Vec<(EventRef<'_>, Effect<'_>)> = batch
        .iter()
        .map(|(id, version, w)| {
            (EventRef { aggregate_type: "order", aggregate_id: id, version: *version }, Effect::Writes(w))
        })
        .collect();
    let p = plan(&TABLES, &TestTypes, &stored, &events).unwrap();
    assert!(fold.absorb(&TABLES, &TestTypes, &p), "folded");
    p.outcomes
}

/// A row write as the tests compare it: table, kind, keys, version expected or written.
type Seen<'a> = (&'a str, RowKind, &'a str, Option<&'a str>, Option<i64>);

fn written(fold: &Fold) -> Vec<Seen<'_>> {
    let rows = fold.rows(&TABLES, 2).flatten();
    rows.map(|r| (r.table.name(), r.kind, r.key, r.child, r.expected.or(r.version))).collect()
}

#[test]
fn a_row_the_fold_made_and_a_later_batch_deleted_is_not_written_and_never_comes_back() {
    let mut fold = Fold::default();
    let e = |v| env("o1", v);
    let placed = vec![ORDERS.write(&e(1)).set("n", 5), LINES.child_row(&e(1), "x").add("q", 2)];
    fold_in(&mut fold, &[], &[("o1", 1, placed.clone())]);
    fold_in(&mut fold, &[], &[("o1", 2, vec![ORDERS.write(&e(2)).delete(), LINES.clear(&e(2))])]);
    // The order was never in the table: nothing of it is written. Its line's add is
    // checked against the line as stored (the clear deletes it), then the clear.
    let want = vec![("lines", RowKind::Check, "o1", Some("x"), None), ("lines", RowKind::Clear, "o1", None, None)];
    assert_eq!(written(&fold), want);
    assert_eq!(fold.aggregates().iter().map(|a| (a.expected, a.version)).collect::<Vec<_>>(), [(None, 2)]);
    assert_eq!(fold.version("orders", "o1"), Some(None), "deleted, whatever the table holds");
    // The first event again (a replay): stale against the aggregate's version, nothing made.
    assert_eq!(fold_in(&mut fold, &[], &[("o1", 1, placed)]), [Outcome::Stale]);
    assert_eq!(written(&fold), want);
    // A later version makes the order again.
    fold_in(&mut fold, &[], &[("o1", 3, vec![ORDERS.write(&e(3)).set("n", 7)])]);
    assert_eq!(written(&fold)[2..], [("orders", RowKind::Insert, "o1", None, Some(3))]);
}

#[test]
fn a_stored_row_deleted_after_the_fold_changed_it_is_checked_then_deleted_at_its_stored_version() {
    let mut fold = Fold::default();
    let e = |v| env("o2", v);
    fold_in(&mut fold, &[("o2", 4)], &[("o2", 5, vec![ORDERS.write(&e(5)).add("n", 1)])]);
    assert_eq!(written(&fold), [("orders", RowKind::Update, "o2", None, Some(4))]);
    fold_in(&mut fold, &[("o2", 4)], &[("o2", 6, vec![ORDERS.write(&e(6)).delete()])]);
    assert_eq!(
        written(&fold),
        [("orders", RowKind::Check, "o2", None, None), ("orders", RowKind::Delete, "o2", None, Some(4))]
    );
    // Cleared children made again after the clear: merged into no row.
    fold_in(
        &mut fold,
        &[],
        &[("o3", 1, vec![LINES.clear(&env("o3", 1)), LINES.child_row(&env("o3", 1), "y").add("q", 1)])],
    );
    fold_in(&mut fold, &[], &[("o3", 2, vec![LINES.child_row(&env("o3", 2), "y").add("q", 4)])]);
    let o3: Vec<_> = written(&fold).into_iter().filter(|w| w.2 == "o3").map(|w| (w.1, w.3)).collect();
    assert_eq!(o3, [(RowKind::Clear, None), (RowKind::Merge, Some("y")), (RowKind::Update, Some("y"))]);
}

//! A rebuild's fold in PostgreSQL: each batch planned against the versions the fold and the
//! tables say and folded in without a write; what the fold holds written set-based, its new
//! rows by `COPY`.

use super::*;

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
    let stored = read_stored(conn, projection, tables, events, false, Some(fold), None).await?;
    // Folded, the rows are written in the fold's order, not the plan's.
    let plan = planned(events, plan_unordered(tables, &PgTypes, &stored, events))?;
    Ok(fold.absorb(tables, &PgTypes, &plan).then_some(plan.outcomes))
}

/// Writes what `fold` holds, set-based, each statement's row count checked: the aggregates'
/// versions (those of aggregates it met first, where it knows all, by `COPY`), then its rows
/// 10,000 at a time (see [`Fold::rows`]), so that their statements' text stays small beside
/// the fold. The rows it creates go in by `COPY` where their values
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
    // The versions of aggregates the tables hold nothing of are new rows: copied in.
    let (new, moved): (Vec<AggregateWrite>, Vec<AggregateWrite>) =
        fold.aggregates().into_iter().partition(|m| fold.knows_all() && m.expected.is_none());
    copy_aggregates(conn, projection, &new).await?;
    write_aggregates(conn, projection, &moved).await?;
    let copy: Vec<TextColumns> = tables.iter().map(TextColumns::of).collect();
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
/// insert (into a gated table, with its version; or a child row of an aggregate the tables
/// hold nothing of), each column set to a value [`TextColumns::takes`].
pub(super) fn copyable(columns: &TextColumns, row: &RowWrite<'_>) -> bool {
    row.kind == RowKind::Insert
        && row.version.is_some() == row.table.is_gated()
        && row.columns.iter().all(|c| c.deltas.is_empty() && c.base.is_some_and(|v| columns.takes(c.column, v)))
}

/// Writes new rows of one table by `COPY … FROM STDIN` (text format), one statement per set
/// of columns, each one's row count checked: a bulk load's rows, which no one else writes
/// (the rows a fold creates were found in no table), with no conflict to resolve. For
/// PostgreSQL, reading their text costs a fraction of parsing them as one JSON array.
pub(super) async fn copy_rows(conn: &mut PgConnection, rows: &[&RowWrite<'_>]) -> Result<()> {
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
        if let Some(child) = row.child {
            text.push(b'\t');
            copy_field(text, child);
        }
        for c in &row.columns {
            text.push(b'\t');
            match c.base {
                Some(Value::String(s)) => copy_field(text, s),
                Some(Value::Null) | None => text.extend_from_slice(b"\\N"),
                Some(v) => write!(text, "{v}").expect("writing to a Vec"),
            }
        }
        match row.version {
            Some(version) => writeln!(text, "\t{version}").expect("writing to a Vec"),
            None => text.push(b'\n'),
        }
        *count += 1;
    }
    let Some(table) = rows.first().map(|r| r.table) else { return Ok(()) };
    let mut keys = vec![Ident::new(table.key())?.to_string()];
    if !table.child_key().is_empty() {
        keys.push(Ident::new(table.child_key())?.to_string());
    }
    let version = table.is_gated().then(|| Ident::new(table.version())).transpose()?;
    let name = Ident::new(table.name())?;
    for (columns, text, count) in shapes {
        let mut names = keys.clone();
        for c in columns {
            names.push(Ident::new(c)?.to_string());
        }
        names.extend(version.as_ref().map(ToString::to_string));
        copy_in(conn, &format!("COPY {name} ({}) FROM STDIN", names.join(", ")), text, (table.name(), count)).await?;
    }
    Ok(())
}

/// Runs `copy` (a `COPY … FROM STDIN`) with `text`, checking that it wrote `count` rows of
/// `table`.
async fn copy_in(conn: &mut PgConnection, copy: &str, text: Vec<u8>, (table, count): (&str, usize)) -> Result<()> {
    let mut copy = conn.copy_in_raw(copy).await?;
    copy.send(text).await?;
    expect_rows(table, count, copy.finish().await?)
}

/// Writes the versions of aggregates no table holds a version of by `COPY`, its row count
/// checked: a version there after all (another writer's) is refused as a duplicate key.
async fn copy_aggregates(conn: &mut PgConnection, projection: &str, marks: &[AggregateWrite]) -> Result<()> {
    if marks.is_empty() {
        return Ok(());
    }
    let mut text = Vec::new();
    for m in marks {
        for field in [projection, &m.aggregate_type, &m.aggregate_id] {
            copy_field(&mut text, field);
            text.push(b'\t');
        }
        writeln!(text, "{}", m.version).expect("writing to a Vec");
    }
    let copy = "COPY projectionist_aggregate_versions (projection, aggregate_type, aggregate_id, version) FROM STDIN";
    copy_in(conn, copy, text, ("projectionist_aggregate_versions", marks.len())).await
}

/// `s` as a field of `COPY`'s text format: its backslashes and the characters that end a
/// field or a row escaped.
pub(super) fn copy_field(out: &mut Vec<u8>, s: &str) {
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

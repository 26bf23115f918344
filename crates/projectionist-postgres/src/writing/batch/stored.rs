//! The versions a batch is planned against, read in bulk (locking the rows only for the
//! per-event path), and the aggregate versions it moves, written.

use std::collections::hash_map::Entry;

use super::*;

pub(super) async fn read_stored<'e>(
    conn: &mut PgConnection,
    projection: &str,
    tables: &[Table],
    events: &[(EventRef<'e>, Effect<'_>)],
    lock: bool,
    fold: Option<&Fold>,
    known: Option<&KnownVersions>,
) -> Result<Stored<'e>> {
    let mut stored = Stored::default();
    for table in tables.iter().filter(|t| t.is_gated()) {
        let mut ids: Vec<&'e str> =
            events.iter().filter(|(e, _)| table.owns(e.aggregate_type)).map(|(e, _)| e.aggregate_id).collect();
        // Rows a fold holds are at the version it says; the others, as the table says. (Asked
        // of the fold first: most keys of a rebuild's batch are there, and only the rest are
        // sorted for the query.)
        let mut folded = fold.map(|fold| take_folded(fold, table, &mut ids)).unwrap_or_default();
        if ids.is_empty() || fold.is_some_and(Fold::knows_all) {
            stored.rows.insert(table.name(), folded);
            continue;
        }
        let (name, key, version) = (Ident::new(table.name())?, Ident::new(table.key())?, Ident::new(table.version())?);
        let select = format!("SELECT {key}, {version} FROM {name} WHERE {key} = ANY($1){}", locked(lock, key.quoted()));
        // The per-event path's reads lock every row: they never take what is known.
        match known.filter(|_| !lock) {
            None => {
                ids.sort_unstable();
                ids.dedup();
                read_versions(conn, &select, &ids, &mut folded).await?;
            }
            Some(known) => read_unknown(conn, table.name(), &name, &select, ids, known, &mut folded).await?,
        }
        stored.rows.insert(table.name(), folded);
    }
    read_aggregates(conn, projection, tables, events, fold, lock, &mut stored).await?;
    Ok(stored)
}

/// The clause a read of versions ends with: with `lock`, the per-event path's, whose reads
/// lock the rows, so that a concurrent writer of the same rows waits (or is waited for)
/// rather than making the event try again, in `key` order, so that two writers lock
/// overlapping rows in the same order. A batch reads without: a row lock writes to the row
/// (it cost a pipeline of orders 6 % of PostgreSQL's CPU), and every write checks the
/// version it builds on, so a writer there after all is met as a row count the plan did not
/// expect, and the batch falls back to the per-event path.
fn locked(lock: bool, key: &str) -> String {
    if lock {
        format!(" ORDER BY {key} FOR UPDATE")
    } else {
        String::new()
    }
}

/// Of `ids` (rows of gated `table`), those `fold` holds a version of, at that version, taken
/// out of `ids` (each once); the others are left to be read from the table.
fn take_folded<'e>(fold: &Fold, table: &Table, ids: &mut Vec<&'e str>) -> Versions<'e> {
    // Room for every key at once: grown by doubling, it was rehashed a few times a batch.
    let mut folded = Versions::with_capacity_and_hasher(ids.len(), Default::default());
    let version = fold.versions(table.name());
    ids.retain(|&id| match folded.entry(id) {
        Entry::Occupied(_) => false,
        Entry::Vacant(slot) => match version(id) {
            Some(Some(v)) => {
                slot.insert(v);
                false
            }
            // Deleted by the fold: no row, whatever the table holds.
            Some(None) => false,
            None => true,
        },
    });
    folded
}

/// The versions of `events`' aggregates gated by their aggregate version, into `stored`:
/// those a fold moves, as it says; the others, as the table says (locked with `lock`).
async fn read_aggregates<'e>(
    conn: &mut PgConnection,
    projection: &str,
    tables: &[Table],
    events: &[(EventRef<'e>, Effect<'_>)],
    fold: Option<&Fold>,
    lock: bool,
    stored: &mut Stored<'e>,
) -> Result<()> {
    let mut aggregates: Vec<(&'e str, &'e str)> = events
        .iter()
        .filter(|(e, _)| aggregate_gated(tables, e.aggregate_type))
        .map(|(e, _)| (e.aggregate_type, e.aggregate_id))
        .collect();
    if let Some(fold) = fold {
        aggregates.retain(|&(t, i)| match fold.aggregate(t, i) {
            Some(v) => {
                stored.aggregates.insert((t, i), v);
                false
            }
            None => true,
        });
    }
    if !aggregates.is_empty() && !fold.is_some_and(Fold::knows_all) {
        aggregates.sort_unstable();
        aggregates.dedup();
        // Per aggregate type (a projection has one or a few): its ids as one array the
        // primary key's index is searched with, at about half the cost of joining (type,
        // id) pairs to it.
        let sql = in_one_row(&format!(
            "SELECT aggregate_id, version FROM projectionist_aggregate_versions \
             WHERE projection = $1 AND aggregate_type = $2 AND aggregate_id = ANY($3){}",
            locked(lock, "aggregate_id")
        ));
        for of_type in aggregates.chunk_by(|a, b| a.0 == b.0) {
            let aggregate_type = of_type[0].0;
            let ids: Vec<&'e str> = of_type.iter().map(|&(_, id)| id).collect();
            let (found, versions): (Vec<String>, Vec<i64>) =
                sqlx::query_as(&sql).bind(projection).bind(aggregate_type).bind(&ids).fetch_one(&mut *conn).await?;
            stored.aggregates.extend(asked(&ids, found, versions).map(|(id, v)| ((aggregate_type, id), v)));
        }
    }
    Ok(())
}

/// The versions of `ids` in `table` (`name`, read by `select`) into `versions`: those
/// `known` holds, and the others read (sorted, once each), with the table's file in the same
/// statement; where the file is not the one the known versions were of, those are read too.
async fn read_unknown<'e>(
    conn: &mut PgConnection,
    table: &'static str,
    name: &Ident,
    select: &str,
    ids: Vec<&'e str>,
    known: &KnownVersions,
    versions: &mut Versions<'e>,
) -> Result<()> {
    let Lookup { known: hits, mut unknown } = known.lookup(table, ids);
    unknown.sort_unstable();
    unknown.dedup();
    let sql = in_one_row_after("pg_relation_filenode(to_regclass($2))::bigint, ", select);
    let (file, keys, read): (Option<i64>, Vec<String>, Vec<i64>) =
        sqlx::query_as(&sql).bind(&unknown).bind(name.quoted()).fetch_one(&mut *conn).await?;
    versions.extend(asked(&unknown, keys, read));
    if known.same_file(table, file) {
        versions.extend(hits);
    } else if !hits.is_empty() {
        let mut ids: Vec<&str> = hits.into_iter().map(|(k, _)| k).collect();
        ids.sort_unstable();
        ids.dedup();
        read_versions(conn, select, &ids, versions).await?;
    }
    Ok(())
}

/// The versions `select` reads for `ids` (its `$1`, sorted) into `versions`.
async fn read_versions<'e>(
    conn: &mut PgConnection,
    select: &str,
    ids: &[&'e str],
    versions: &mut Versions<'e>,
) -> Result<()> {
    let (keys, read): (Vec<String>, Vec<i64>) =
        sqlx::query_as(&in_one_row(select)).bind(ids).fetch_one(&mut *conn).await?;
    versions.extend(asked(ids, keys, read));
    Ok(())
}

/// The keys a query `found`, each with its version, as the keys of `asked` (sorted) they
/// are, so that what is stored is keyed by what the batch's events hold. A key found that
/// is not one asked for (a key column whose equality is not its text's, as `citext`) is left
/// out, as a version no event's key looks up.
fn asked<'a, 'e>(
    asked: &'a [&'e str],
    found: Vec<String>,
    versions: Vec<i64>,
) -> impl Iterator<Item = (&'e str, i64)> + 'a {
    let found = found.into_iter().zip(versions);
    found.filter_map(|(key, version)| asked.binary_search(&key.as_str()).ok().map(|at| (asked[at], version)))
}

/// `select` (of a key and a version, its rows locked as it says) answered as one row of two
/// arrays: a batch's thousands of versions cost the client one row to decode, not thousands.
fn in_one_row(select: &str) -> String {
    in_one_row_after("", select)
}

/// As [`in_one_row`], the row's arrays after the columns `first` (each followed by a comma).
fn in_one_row_after(first: &str, select: &str) -> String {
    format!("SELECT {first}coalesce(array_agg(k), '{{}}'), coalesce(array_agg(v), '{{}}') FROM ({select}) AS s(k, v)")
}

pub(super) async fn write_aggregates(
    conn: &mut PgConnection,
    projection: &str,
    marks: &[AggregateWrite],
) -> Result<()> {
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

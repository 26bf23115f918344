//! The set-based statements: a plan's row writes grouped by table and shape, each group one
//! statement over its rows (typed arrays, or a JSON array: see [`rows`](super::rows)), its
//! row count checked.

use super::rows::{self, Inputs, Rows, EXPECTED};
use super::shape::{same_name, ColumnKind, Shape};
use super::*;
use projectionist_core::plan::IntRange;

/// Writes `rows`, one statement per table and shape, each statement's row count checked.
pub(super) async fn write_row_writes<'r, 'a: 'r>(
    conn: &mut PgConnection,
    rows: impl IntoIterator<Item = &'r RowWrite<'a>>,
) -> Result<()> {
    for (table, shape, rows) in group(rows) {
        write_rows(conn, table, &shape, rows).await?;
    }
    Ok(())
}

/// Row writes grouped by table, shape and the way their rows travel (see [`rows`](super::rows)),
/// one statement each, in plan order: each row encoded once, straight into its statement's
/// rows.
pub(super) fn group<'r, 'a: 'r>(rows: impl IntoIterator<Item = &'r RowWrite<'a>>) -> Vec<(Table, Shape, Rows)> {
    let mut groups: Vec<(Table, Shape, Rows)> = Vec::new();
    // Per table and shape: how its fields go as arrays, and where its rows are that go as
    // JSON and as arrays in `groups`.
    let mut kinds: Vec<(&'static str, Shape, Inputs, [Option<usize>; 2])> = Vec::new();
    let (mut fields, mut shape) = (Vec::new(), Shape { kind: RowKind::Update, columns: Vec::new() });
    for row in rows {
        rows::fields(row, &mut fields, &mut shape);
        let table = row.table.name();
        let kind = match kinds.iter().position(|(t, s, ..)| same_name(t, table) && s.same(&shape)) {
            Some(k) => &mut kinds[k],
            None => {
                kinds.push((table, shape.clone(), Inputs::of(&row.table, &fields), [None; 2]));
                kinds.last_mut().expect("just pushed")
            }
        };
        let arrays = kind.2.take(&fields);
        match kind.3[usize::from(arrays)] {
            Some(i) => groups[i].2.push(&fields),
            None => {
                let mut rows = Rows::new(&kind.2, &fields, arrays);
                rows.push(&fields);
                kind.3[usize::from(arrays)] = Some(groups.len());
                groups.push((row.table, shape.clone(), rows));
            }
        }
    }
    groups
}

/// Writes `rows` of `table`, all of one `shape`, in one statement; one that must change every
/// row it is given and changed fewer fails as a concurrent write ([`expect_rows`]).
pub(super) async fn write_rows(conn: &mut PgConnection, table: Table, shape: &Shape, rows: Rows) -> Result<()> {
    let parts = Parts::of(&table, shape, &rows)?;
    let (sql, check) = match shape.kind {
        RowKind::Insert | RowKind::Merge => parts.insert(shape.kind),
        RowKind::Delete => parts.delete(),
        RowKind::Check => parts.check(),
        RowKind::Clear => parts.clear(),
        RowKind::Update => parts.update(),
    };
    let planned = rows.count();
    let mut query = sqlx::query(&sql);
    match rows {
        Rows::Json { mut json, .. } => {
            // Sent as text and read as `jsonb` by PostgreSQL (which parses it anyway:
            // checking it here too cost about 2 % of the CPU of a bulk load).
            json.push(b']');
            query = query.bind(String::from_utf8(json).expect("serde_json writes UTF-8"));
        }
        Rows::Arrays(arrays) => {
            for array in arrays.data {
                query = query.bind(array);
            }
        }
    }
    let result = query.bind(planned as i64).execute(&mut *conn).await?;
    if check {
        expect_rows(table.name(), planned, result.rows_affected())?;
    }
    Ok(())
}

/// What a table's row statement of one shape is made of: its names, and its rows as typed
/// records of the table (`s`), each with the version it must still have and, per folded
/// column, its deltas. Each statement comes with whether it must change every row it is
/// given.
struct Parts<'s> {
    name: Ident,
    key: Ident,
    /// A child table's key of the child (its rows are keyed by the aggregate id with it).
    child: Option<Ident>,
    version: Option<Ident>,
    columns: Vec<(&'s str, Ident, ColumnKind)>,
    /// The row's key columns, and what makes a stored row (`t`) the given one (`s`).
    keys: String,
    same_row: String,
    source: String,
}

impl<'s> Parts<'s> {
    fn of(table: &Table, shape: &'s Shape, rows: &Rows) -> Result<Self> {
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
        let columns =
            shape.columns.iter().map(|(c, kind)| Ok((*c, Ident::new(c)?, *kind))).collect::<Result<Vec<_>>>()?;
        let source = match rows {
            Rows::Json { .. } => json_source(&name, &columns),
            Rows::Arrays(arrays) => arrays_source(&arrays.spec)?,
        };
        Ok(Self { name, key, child, version, columns, keys, same_row, source })
    }

    /// The value a column is written with.
    fn value(&self, (raw, column, kind): &(&str, Ident, ColumnKind)) -> String {
        match kind {
            ColumnKind::Set | ColumnKind::Add => format!("s.{column}"),
            ColumnKind::FoldValue => self.fold(raw, column, &format!("s.{column}")),
            ColumnKind::FoldStored => self.fold(raw, column, &format!("t.{column}")),
            ColumnKind::SumStored(ty) => {
                let IntRange { min, max } = ty.range();
                let at = |part: &str| format!("t.{column}::numeric + s.\"{raw}${part}\"");
                // Past the type's range, the cast raises the overflow a step per event raises.
                format!(
                    "CASE WHEN {hi} > {max} THEN ({hi})::{ty} WHEN {lo} < {min} THEN ({lo})::{ty} ELSE ({sum})::{ty} \
                     END",
                    hi = at("hi"),
                    lo = at("lo"),
                    sum = at("sum"),
                    ty = ty.name()
                )
            }
        }
    }

    /// A folded column's value: its deltas folded over `base`, in order.
    fn fold(&self, raw: &str, column: &Ident, base: &str) -> String {
        let name = &self.name;
        format!(
            "(SELECT projectionist_fold(f.v ORDER BY f.n) FROM (SELECT 0::bigint AS n, {base} AS v UNION ALL \
             SELECT d.ordinality, d.{column} FROM jsonb_populate_recordset(NULL::{name}, s.\"{raw}$d\") WITH \
             ORDINALITY AS d) AS f)"
        )
    }

    /// New rows (`Insert`), or rows written whether or not they are there (`Merge`).
    fn insert(&self, kind: RowKind) -> (String, bool) {
        let (name, key, source, keys) = (&self.name, &self.key, &self.source, &self.keys);
        let mut names = vec![key.to_string()];
        let mut values = vec![format!("s.{key}")];
        if let Some(child) = &self.child {
            names.push(child.to_string());
            values.push(format!("s.{child}"));
        }
        for c in &self.columns {
            names.push(c.1.to_string());
            values.push(self.value(c));
        }
        if let Some(version) = &self.version {
            names.push(version.to_string());
            values.push(format!("s.{version}"));
        }
        let conflict = if kind == RowKind::Insert || self.columns.is_empty() {
            "DO NOTHING".to_owned()
        } else {
            let sets = self.columns.iter().map(|(_, c, kind)| match kind {
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
        (sql, kind == RowKind::Insert || !self.columns.is_empty())
    }

    /// A gated row at the version it must still have (counted); a fan-in row whatever it
    /// holds (one that is not there deletes nothing, as one event at a time does).
    fn delete(&self) -> (String, bool) {
        let (name, source, same_row) = (&self.name, &self.source, &self.same_row);
        match &self.version {
            Some(version) => (
                format!("DELETE FROM {name} AS t USING {source} WHERE {same_row} AND t.{version} = s.\"$expected\""),
                true,
            ),
            None => (format!("DELETE FROM {name} AS t USING {source} WHERE {same_row}"), false),
        }
    }

    /// What the row would have been written, evaluated against it as stored (each column as
    /// an update computes it), nothing written: a value the update would have refused (an
    /// add's overflow) raises here.
    fn check(&self) -> (String, bool) {
        let values = self.columns.iter().map(|c| match c.2 {
            ColumnKind::Add => format!("t.{col} + s.{col}", col = c.1),
            _ => self.value(c),
        });
        let (name, source, same_row) = (&self.name, &self.source, &self.same_row);
        (format!("SELECT {} FROM {name} AS t, {source} WHERE {same_row}", values.collect::<Vec<_>>().join(", ")), false)
    }

    /// Every child of each aggregate, however many there are.
    fn clear(&self) -> (String, bool) {
        let (name, key, source) = (&self.name, &self.key, &self.source);
        (format!("DELETE FROM {name} AS t USING {source} WHERE t.{key} = s.{key}"), false)
    }

    /// Stored rows changed, each at the version it must still have when gated (counted).
    fn update(&self) -> (String, bool) {
        let mut sets: Vec<String> = self
            .columns
            .iter()
            .map(|c| match c.2 {
                ColumnKind::Add => format!("{col} = t.{col} + s.{col}", col = c.1),
                _ => format!("{} = {}", c.1, self.value(c)),
            })
            .collect();
        let mut guard = self.same_row.clone();
        if let Some(version) = &self.version {
            sets.push(format!("{version} = s.{version}"));
            guard.push_str(&format!(" AND t.{version} = s.\"$expected\""));
        }
        let (name, source) = (&self.name, &self.source);
        (format!("UPDATE {name} AS t SET {} FROM {source} WHERE {guard}", sets.join(", ")), true)
    }
}

/// The rows of a statement as typed records of the table (`s`) from a JSON array of objects
/// (`$1`, `$2` rows), each with the version it must still have and, per folded column, its
/// deltas, per summed column its running sums.
fn json_source(name: &Ident, columns: &[(&str, Ident, ColumnKind)]) -> String {
    let mut extra = vec![format!("(x.doc->>'{EXPECTED}')::bigint AS \"{EXPECTED}\"")];
    extra.extend(
        columns.iter().filter(|(_, _, k)| k.folds()).map(|(raw, ..)| format!("x.doc->'{raw}$d' AS \"{raw}$d\"")),
    );
    for (raw, ..) in columns.iter().filter(|(_, _, k)| matches!(k, ColumnKind::SumStored(_))) {
        for part in ["lo", "hi", "sum"] {
            extra.push(format!("(x.doc->>'{raw}${part}')::numeric AS \"{raw}${part}\""));
        }
    }
    // `LIMIT $2`, the number of rows, tells the planner how few rows a small batch holds:
    // `jsonb_array_elements` alone counts for 100 rows whatever the array, and a batch at
    // the head (tens of rows) was joined to a table of some thousands by a hash over a scan
    // of the whole table (3.3 ms for 60 rows of 7,700, against 0.9 ms through the key's
    // index). A large batch still counts for 100 rows: planned for its true size, a bulk
    // load took the scans and ran 15-25 % slower in the bench's pipeline arm.
    format!(
        "(SELECT r.*, {} FROM (SELECT doc FROM jsonb_array_elements($1::jsonb) AS e(doc) LIMIT $2) AS x, \
        LATERAL jsonb_populate_record(NULL::{name}, x.doc) AS r) AS s",
        extra.join(", ")
    )
}

/// The rows of a statement as records (`s`) zipped from one array per field (`$1` … `$n`,
/// `$n+1` rows), each text cast to its column's type. Each array is read through a subquery,
/// so that the planner counts it as a few rows whatever its length, as it counts the JSON
/// array (see [`json_source`]).
fn arrays_source(spec: &[(&'static str, &'static str, Option<&'static str>)]) -> Result<String> {
    let (mut arrays, mut fields) = (Vec::new(), Vec::new());
    for (i, &(name, suffix, cast)) in spec.iter().enumerate() {
        let alias = match suffix {
            "" if name != EXPECTED => Ident::new(name)?.to_string(),
            _ => format!("\"{name}{suffix}\""),
        };
        let n = i + 1;
        match cast {
            Some(ty) => {
                arrays.push(format!("(SELECT ${n}::text[])"));
                fields.push(format!("u.f{n}::{ty} AS {alias}"));
            }
            None => {
                arrays.push(format!("(SELECT ${n}::bigint[])"));
                fields.push(format!("u.f{n} AS {alias}"));
            }
        }
    }
    let names = (1..=spec.len()).map(|n| format!("f{n}")).collect::<Vec<_>>().join(", ");
    Ok(format!(
        "(SELECT {} FROM unnest({}) AS u({names}) LIMIT ${}) AS s",
        fields.join(", "),
        arrays.join(", "),
        spec.len() + 1
    ))
}

pub(super) fn expect_rows(table: &str, planned: usize, changed: u64) -> Result<()> {
    if changed == planned as u64 {
        Ok(())
    } else {
        Err(Error::Conflict { detail: format!("{table}: planned {planned} row(s), changed {changed}") })
    }
}

#[cfg(test)]
mod tests {
    use crate::tables::types::IntType::{Big, Small};
    use projectionist_core::plan::RunningSums;
    use serde_json::json;

    #[test]
    fn integer_columns_sum_exactly_with_their_running_extremes() {
        let ds = [json!(5), json!(-12), json!(u64::MAX), json!(-3)];
        assert_eq!(Big.range().sums(&ds), None, "a delta the type cannot take goes to the fold");
        let ds = [json!(5), json!(-12), json!(i64::MAX), json!(-3)];
        let max = i128::from(i64::MAX);
        assert_eq!(Big.range().sums(&ds), Some(RunningSums { lo: -7, hi: max - 7, sum: max - 10 }));
        assert_eq!(Small.range().sums(&[json!(1.5)]), None, "not an integer: the fold");
        assert_eq!(Small.range().sums(&[json!("7")]), None, "a string: the fold");
        assert_eq!(Small.range().sums(&[json!(40_000), json!(-40_000)]), None, "a delta past the type: the fold");
        let total = |base, ds: &[serde_json::Value]| Small.range().total(&base, ds);
        assert_eq!(total(json!(32000), &[json!(700), json!(-700)]), Some(32000));
        assert_eq!(total(json!(32000), &[json!(800), json!(-800)]), None, "a step overflows");
        assert_eq!(total(json!(-32768), &[json!(-1), json!(1)]), None, "a step overflows");
        assert_eq!(total(json!(40_000), &[json!(-10_000)]), None, "a base past the type");
        assert_eq!(Big.range().total(&json!("5"), &[json!(1)]), None, "a string base: the fold");
    }
}

//! Read-model tables, declared once: name, key, version column, columns and gate. The
//! engine derives from a declaration the DDL, the version gate, what a reset empties and
//! what the test kit compares.

/// How a table's rows are protected against duplicates, replays and reordering.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Gate {
    /// **State transfer**: one row per aggregate, each event carrying the row's state.
    /// Applied when the event is newer than the row (`WHERE t.version < EXCLUDED.version`);
    /// versions may be skipped. Columns are only `set`.
    Upsert,
    /// **Guarded transition**: one row per aggregate, each event changing it relative to its
    /// state (`balance + amount`, a status move). Applied only when the row stands at exactly
    /// `version - 1`; version 1 creates the row.
    Transition,
    /// **Fan-in**: rows not 1:1 with aggregates (totals per customer fed by many orders),
    /// gated by the aggregate's version (`projectionist_aggregate_versions`), which every event of
    /// the projection advances by a guarded transition.
    FanIn,
    /// **Child rows** of an aggregate (a cart's lines): keyed by the aggregate id and a key
    /// of the child together, gated by the aggregate's version (as for fan-in); a write
    /// creates, changes or deletes one child, a clear removes every child of the aggregate.
    Child,
    /// Written only by the projection's own SQL in `apply` (the slow path): the engine
    /// creates, empties and compares it, never writes it, and gates the events `apply`
    /// sees by the aggregate's version, as for fan-in.
    Custom,
}

/// The longest aggregate id, aggregate type or fan-in row key the engine stores, in bytes.
///
/// Keys are primary keys: PostgreSQL refuses a B-tree entry over about 2,700 bytes, so a
/// longer key would fail in the middle of a batch. An event with a longer key (or one
/// holding a NUL character, which `text` cannot store) is refused before anything is
/// written, naming the event.
pub const MAX_KEY_BYTES: usize = 1024;

/// Checks a key against [`MAX_KEY_BYTES`] and PostgreSQL's `text` (no NUL character).
pub fn check_key(what: &str, key: &str) -> Result<(), String> {
    if key.len() > MAX_KEY_BYTES {
        Err(format!("{what} is {} bytes long, longer than the {MAX_KEY_BYTES} bytes a key may have", key.len()))
    } else if key.as_bytes().contains(&0) {
        Err(format!("{what} holds a NUL character (\\u0000), which PostgreSQL text cannot store"))
    } else {
        Ok(())
    }
}

/// Which aggregate types' events a table belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Owners {
    Undeclared,
    One(&'static str),
    Many(&'static [&'static str]),
}

/// A read-model table, declared once as a `const` and used everywhere by reference.
///
/// ```
/// use projectionist_core::Table;
///
/// const ACCOUNTS: Table = Table::transition("bank_accounts", "account_id")
///     .aggregate_type("account")
///     .columns(&[("owner", "text"), ("balance", "bigint NOT NULL DEFAULT 0")]);
///
/// assert_eq!(
///     ACCOUNTS.ddl(),
///     concat!(
///         r#"CREATE TABLE IF NOT EXISTS "bank_accounts" ("account_id" text PRIMARY KEY, "owner" text, "#,
///         r#""balance" bigint NOT NULL DEFAULT 0, "version" bigint NOT NULL)"#
///     )
/// );
/// ```
///
/// Names must be plain identifiers (ASCII letters, digits, `_`, optionally `schema.table`);
/// the engine checks them before running any SQL and always quotes them. Column types are
/// SQL, written by you, never taken from input. Keys are `text`.
///
/// ## Aggregate types
/// An aggregate is its type and its id together: `account/42` and `customer/42` are two
/// aggregates. An upsert or transition table holds one row per aggregate of the type it
/// declares with [`aggregate_type`](Table::aggregate_type) (required: the engine refuses a
/// gated table without one), and only events of that type move its rows' versions — so a
/// topic carrying several aggregate types with overlapping ids is safe. Fan-in and custom
/// tables may declare types too: then only those types' events are gated by the
/// aggregate version; undeclared, every event of the projection is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Table {
    name: &'static str,
    key: &'static str,
    version: &'static str,
    gate: Gate,
    columns: &'static [(&'static str, &'static str)],
    ddl: Option<&'static str>,
    owners: Owners,
    deletable: bool,
    child: &'static str,
    key_types: [&'static str; 2],
}

impl Table {
    const fn new(name: &'static str, key: &'static str, gate: Gate) -> Self {
        let owners = Owners::Undeclared;
        let key_types = ["text", "text"];
        Self {
            name,
            key,
            version: "version",
            gate,
            columns: &[],
            ddl: None,
            owners,
            deletable: false,
            child: "",
            key_types,
        }
    }

    /// Whether `other` is this declaration (`==`, asked for every write a batch plans:
    /// copies of one `const` share their text, so each field's address is compared before
    /// its bytes).
    pub fn same(&self, other: &Table) -> bool {
        let text = same_text;
        let Self { name, key, version, gate, columns, ddl, owners, deletable, child, key_types } = *other;
        let owners = match (self.owners, owners) {
            (Owners::One(a), Owners::One(b)) => text(a, b),
            (Owners::Many(a), Owners::Many(b)) => std::ptr::eq(a, b) || a == b,
            (a, b) => a == b,
        };
        let ddl = match (self.ddl, ddl) {
            (Some(a), Some(b)) => text(a, b),
            (a, b) => a == b,
        };
        (std::ptr::eq(self.columns, columns) || self.columns == columns)
            && text(self.name, name)
            && text(self.key, key)
            && text(self.version, version)
            && self.gate == gate
            && ddl
            && owners
            && self.deletable == deletable
            && text(self.child, child)
            && text(self.key_types[0], key_types[0])
            && text(self.key_types[1], key_types[1])
    }

    /// A [state-transfer](Gate::Upsert) table keyed by the aggregate id in column `key`.
    pub const fn upsert(name: &'static str, key: &'static str) -> Self {
        Self::new(name, key, Gate::Upsert)
    }

    /// A [guarded-transition](Gate::Transition) table keyed by the aggregate id in `key`.
    pub const fn transition(name: &'static str, key: &'static str) -> Self {
        Self::new(name, key, Gate::Transition)
    }

    /// A [fan-in](Gate::FanIn) table keyed by `key` (any text key: a customer id, a day).
    pub const fn fan_in(name: &'static str, key: &'static str) -> Self {
        Self::new(name, key, Gate::FanIn)
    }

    /// A [custom](Gate::Custom) table created by `ddl` (an idempotent `CREATE TABLE IF NOT
    /// EXISTS …`), written only by the projection's `apply`.
    pub const fn custom(name: &'static str, ddl: &'static str) -> Self {
        Self {
            name,
            key: "",
            version: "",
            gate: Gate::Custom,
            columns: &[],
            ddl: Some(ddl),
            owners: Owners::Undeclared,
            deletable: false,
            child: "",
            key_types: ["text", "text"],
        }
    }

    /// A [fan-in](Gate::FanIn) table keyed by one or two typed columns, `(name, type)` with a
    /// type of `text`, `date` or `bigint`: e.g. `Table::fan_in_keys("daily_totals",
    /// &[("day", "date"), ("currency", "text")])`, written with `row_keys(day, currency)`
    /// (or `row(day)` for one column). A key's value is given as text, in the type's
    /// canonical form (`2026-11-27`, `-42`): another spelling of the same value could not be
    /// told apart from it in a batch, so it is refused.
    pub const fn fan_in_keys(name: &'static str, keys: &'static [(&'static str, &'static str)]) -> Self {
        let mut table = Self::new(name, keys[0].0, Gate::FanIn);
        table.key_types[0] = keys[0].1;
        if keys.len() > 1 {
            table.child = keys[1].0;
            table.key_types[1] = keys[1].1;
        }
        table
    }

    /// A [child](Gate::Child) table: rows keyed by the aggregate id in column `parent` and the
    /// child's own key in column `key` (the primary key is both), e.g.
    /// `Table::child("cart_lines", "cart_id", "sku")`. Declares its aggregate type.
    pub const fn child(name: &'static str, parent: &'static str, key: &'static str) -> Self {
        let mut table = Self::new(name, parent, Gate::Child);
        table.child = key;
        table
    }

    /// The aggregate type whose events this table belongs to (see [the type's docs](Table)).
    pub const fn aggregate_type(mut self, aggregate_type: &'static str) -> Self {
        self.owners = Owners::One(aggregate_type);
        self
    }

    /// Several aggregate types whose ids never overlap share this table.
    pub const fn aggregate_types(mut self, aggregate_types: &'static [&'static str]) -> Self {
        self.owners = Owners::Many(aggregate_types);
        self
    }

    /// Rows of this upsert or transition table may be deleted (`write(event).delete()`).
    /// A row's version goes with it, so its aggregate's version is also kept where the
    /// engine keeps fan-in's (`projectionist_aggregate_versions`, moved by every event of the
    /// aggregate, a write per aggregate and batch): a duplicate or a replay of an earlier
    /// event is told apart after the row is gone, and never brings it back. A row is then
    /// made by the first event that writes it (at version 1, or after a delete: an aggregate
    /// that reopens), not by any event of its aggregate.
    pub const fn deletable(mut self) -> Self {
        self.deletable = true;
        self
    }

    /// Whether rows of this upsert or transition table may be deleted (see [`Table::deletable`]).
    pub const fn is_deletable(&self) -> bool {
        self.deletable && self.is_gated()
    }

    /// Whether events of `aggregate_type` belong to this table (all do to a fan-in or
    /// custom table that declares no type).
    pub fn owns(&self, aggregate_type: &str) -> bool {
        match self.owners {
            Owners::Undeclared => !self.is_gated(),
            Owners::One(t) => t == aggregate_type,
            Owners::Many(ts) => ts.contains(&aggregate_type),
        }
    }

    /// The declared aggregate types (empty: none declared).
    pub fn aggregate_types_declared(&self) -> &[&'static str] {
        match &self.owners {
            Owners::Undeclared => &[],
            Owners::One(t) => std::slice::from_ref(t),
            Owners::Many(ts) => ts,
        }
    }

    /// Checks the declaration beyond its identifiers: a gated table names its aggregate type.
    pub fn check(&self) -> Result<(), String> {
        let keys = [(self.key, self.key_types[0]), (self.child, self.key_types[1])];
        if let Some((key, ty)) = keys.iter().find(|(_, ty)| !matches!(*ty, "text" | "date" | "bigint")) {
            return Err(format!("table {}: key column {key} is {ty}; a key is text, date or bigint", self.name));
        }
        if self.gate == Gate::Child && self.aggregate_types_declared().is_empty() {
            return Err(format!(
                "table {} holds the children of one type of aggregate: declare which with .aggregate_type(\"…\")",
                self.name
            ));
        }
        if self.is_gated() && self.aggregate_types_declared().is_empty() {
            return Err(format!(
                "table {} holds one row per aggregate: declare which aggregate type with \
                 .aggregate_type(\"…\") (or .aggregate_types(&[…]) for types whose ids never overlap)",
                self.name
            ));
        }
        Ok(())
    }

    /// The columns besides key and version: `(name, SQL type and constraints)`.
    pub const fn columns(mut self, columns: &'static [(&'static str, &'static str)]) -> Self {
        self.columns = columns;
        self
    }

    /// Keeps the version in another column than `version`.
    pub const fn version_column(mut self, column: &'static str) -> Self {
        self.version = column;
        self
    }

    /// The table name.
    pub const fn name(&self) -> &'static str {
        self.name
    }

    /// The key column (of a child table: the aggregate id, its parent).
    pub const fn key(&self) -> &'static str {
        self.key
    }

    /// The second key column: a child table's child key, a fan-in table's second key (`""`
    /// where the key is one column).
    pub const fn child_key(&self) -> &'static str {
        self.child
    }

    /// The SQL types of the key columns (`text` but where [`Table::fan_in_keys`] says).
    pub const fn key_types(&self) -> [&'static str; 2] {
        self.key_types
    }

    /// The version column (gated tables only).
    pub const fn version(&self) -> &'static str {
        self.version
    }

    /// How the table is gated.
    pub const fn gate(&self) -> Gate {
        self.gate
    }

    /// Whether the version gate of this table moves with every event of the aggregate
    /// (upsert and transition tables).
    pub const fn is_gated(&self) -> bool {
        matches!(self.gate, Gate::Upsert | Gate::Transition)
    }

    /// Whether `column` may be written: the key, or a declared column.
    pub fn has_column(&self, column: &str) -> bool {
        self.columns.iter().any(|(c, _)| same_text(c, column))
    }

    /// The declared columns: name and SQL type (with its constraints), as [`Table::columns`]
    /// took them.
    pub fn column_declarations(&self) -> &'static [(&'static str, &'static str)] {
        self.columns
    }

    /// The declared SQL type of `column` (with its constraints), if declared.
    pub fn column_type(&self, column: &str) -> Option<&'static str> {
        self.columns.iter().find(|(c, _)| same_text(c, column)).map(|(_, ty)| *ty)
    }

    /// Every identifier of the declaration (table, key, version, columns), for validation.
    pub fn identifiers(&self) -> Vec<&'static str> {
        let mut all = vec![self.name];
        if self.gate != Gate::Custom {
            all.push(self.key);
            all.extend(self.columns.iter().map(|(c, _)| *c));
        }
        if !self.child.is_empty() {
            all.push(self.child);
        }
        if self.is_gated() {
            all.push(self.version);
        }
        all
    }

    /// Idempotent DDL creating the table (`CREATE TABLE IF NOT EXISTS`), identifiers quoted.
    pub fn ddl(&self) -> String {
        if let Some(ddl) = self.ddl {
            return ddl.to_owned();
        }
        let mut cols: Vec<String> =
            self.column_definitions().iter().map(|(c, def)| format!("{} {def}", quote(c))).collect();
        cols.extend(self.primary_key_clause());
        format!("CREATE TABLE IF NOT EXISTS {} ({})", quote(self.name), cols.join(", "))
    }

    /// A primary key of several columns, as a table constraint (a child table's parent and
    /// key); `None` where the key column declares it.
    pub fn primary_key_clause(&self) -> Option<String> {
        (!self.child.is_empty()).then(|| format!("PRIMARY KEY ({}, {})", quote(self.key), quote(self.child)))
    }

    /// Every column of the table as its DDL declares it, in order: `(name, type and
    /// constraints)` for the key (`text PRIMARY KEY`), the declared columns and, on gated
    /// tables, the version (`bigint NOT NULL`). Empty for a custom table.
    pub fn column_definitions(&self) -> Vec<(&'static str, String)> {
        if self.gate == Gate::Custom {
            return Vec::new();
        }
        let [first, second] = self.key_types;
        let mut cols = match self.child {
            "" => vec![(self.key, format!("{first} PRIMARY KEY"))],
            child => vec![(self.key, format!("{first} NOT NULL")), (child, format!("{second} NOT NULL"))],
        };
        cols.extend(self.columns.iter().map(|(c, ty)| (*c, (*ty).to_owned())));
        if self.is_gated() {
            cols.push((self.version, "bigint NOT NULL".to_owned()));
        }
        cols
    }
}

/// Quotes a `name` or `schema.name` for SQL (validity is checked by the engine).
pub fn quote(name: &str) -> String {
    name.split('.').map(|p| format!("\"{p}\"")).collect::<Vec<_>>().join(".")
}

/// Whether two names are the same: by address first (a declaration's names are `'static`
/// text, shared by every copy of it), then by their bytes. Asked for each value a batch
/// writes.
pub(crate) fn same_text(a: &str, b: &str) -> bool {
    std::ptr::eq(a, b) || a == b
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `same` is `==`: copies of one declaration are the same, and a difference in any
    /// field (text with other addresses included) makes another.
    #[test]
    fn same_is_equality_of_every_field() {
        const T: Table = Table::transition("orders", "order_id").aggregate_type("order").columns(&[("n", "bigint")]);
        let name = String::from("orders").leak();
        let with_other_text = Table::transition(name, "order_id").aggregate_type("order").columns(&[("n", "bigint")]);
        assert!(T.same(&T) && T.same(&with_other_text) && with_other_text == T);
        let others = [
            Table::transition("orders2", "order_id").aggregate_type("order").columns(&[("n", "bigint")]),
            Table::transition("orders", "id").aggregate_type("order").columns(&[("n", "bigint")]),
            Table::upsert("orders", "order_id").aggregate_type("order").columns(&[("n", "bigint")]),
            Table::transition("orders", "order_id").aggregate_type("cart").columns(&[("n", "bigint")]),
            Table::transition("orders", "order_id").aggregate_types(&["order", "cart"]).columns(&[("n", "bigint")]),
            Table::transition("orders", "order_id").aggregate_type("order").columns(&[("n", "integer")]),
            T.version_column("v"),
            T.deletable(),
            Table::child("orders", "order_id", "sku").aggregate_type("order").columns(&[("n", "bigint")]),
            Table::custom("orders", "CREATE TABLE orders (id text)"),
        ];
        for other in others {
            assert!(!T.same(&other) && !other.same(&T), "{other:?}");
            assert_eq!(other.same(&other), other == other);
        }
        let a = Table::custom("c", "CREATE TABLE c (id text)");
        assert!(!a.same(&Table::custom("c", "CREATE TABLE c (id bigint)")) && a.same(&a));
    }

    #[test]
    fn ddl_for_each_gate() {
        let stats = Table::fan_in("stats", "customer_id").columns(&[("n", "bigint NOT NULL")]);
        assert_eq!(
            stats.ddl(),
            r#"CREATE TABLE IF NOT EXISTS "stats" ("customer_id" text PRIMARY KEY, "n" bigint NOT NULL)"#
        );
        let t = Table::upsert("read.orders", "id").version_column("v");
        assert_eq!(
            t.ddl(),
            r#"CREATE TABLE IF NOT EXISTS "read"."orders" ("id" text PRIMARY KEY, "v" bigint NOT NULL)"#
        );
        assert_eq!(t.identifiers(), vec!["read.orders", "id", "v"]);
        let c = Table::custom("notes", "CREATE TABLE IF NOT EXISTS notes (x int)");
        assert_eq!(c.ddl(), "CREATE TABLE IF NOT EXISTS notes (x int)");
        assert!(!c.is_gated() && !stats.is_gated() && t.is_gated());
        let lines = Table::child("lines", "cart_id", "sku").aggregate_type("cart").columns(&[("qty", "int")]);
        assert_eq!(
            lines.ddl(),
            r#"CREATE TABLE IF NOT EXISTS "lines" ("cart_id" text NOT NULL, "sku" text NOT NULL, "qty" int, PRIMARY KEY ("cart_id", "sku"))"#
        );
        assert_eq!(lines.identifiers(), vec!["lines", "cart_id", "qty", "sku"]);
        assert!(Table::child("lines", "cart_id", "sku").check().unwrap_err().contains(".aggregate_type"));
        let daily = Table::fan_in_keys("daily", &[("day", "date"), ("currency", "text")]).columns(&[("n", "bigint")]);
        assert_eq!(
            daily.ddl(),
            r#"CREATE TABLE IF NOT EXISTS "daily" ("day" date NOT NULL, "currency" text NOT NULL, "n" bigint, PRIMARY KEY ("day", "currency"))"#
        );
        let by_day = Table::fan_in_keys("by_day", &[("day", "date")]);
        assert_eq!(by_day.ddl(), r#"CREATE TABLE IF NOT EXISTS "by_day" ("day" date PRIMARY KEY)"#);
        assert!(Table::fan_in_keys("t", &[("at", "timestamptz")])
            .check()
            .unwrap_err()
            .contains("text, date or bigint"));
    }
}

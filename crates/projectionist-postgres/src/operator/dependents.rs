//! What depends on a projection's live tables beyond the tables themselves, carried across a
//! rebuild's swap (and its rollback): the views over them, with their grants, and the grants
//! on the tables. A view follows its tables wherever they move, so left alone it would read
//! the replaced tables after a swap, and `rebuild --drop-old` would drop it with them. What
//! the swap cannot carry (a materialized view, a foreign key from a table of another
//! projection or of the application) refuses the swap, naming it.

use sqlx::PgConnection;

use crate::error::{Error, Result};
use crate::tables::ident::Ident;

/// What depends on a set of tables, read before they are replaced.
#[derive(Debug, Default)]
pub(crate) struct Dependents {
    /// The views over them (also over each other), in creation order: name and definition.
    views: Vec<(String, String)>,
    /// What re-grants each view's and each table's privileges once replaced.
    grants: Vec<String>,
}

/// Reads what depends on `tables` (schema, table), or refuses what cannot be carried.
pub(crate) async fn read(conn: &mut PgConnection, projection: &str, tables: &[(Ident, Ident)]) -> Result<Dependents> {
    let names: Vec<String> = tables.iter().map(|(schema, table)| format!("{schema}.{table}")).collect();
    let found: Vec<(String, String, String)> = sqlx::query_as(
        "WITH RECURSIVE over(oid) AS ( \
           SELECT r.ev_class FROM pg_depend d JOIN pg_rewrite r ON r.oid = d.objid \
           WHERE d.classid = 'pg_rewrite'::regclass AND d.refclassid = 'pg_class'::regclass \
             AND d.refobjid = ANY($1::regclass[]) AND r.ev_class <> d.refobjid \
           UNION \
           SELECT r.ev_class FROM over JOIN pg_depend d ON d.refobjid = over.oid JOIN pg_rewrite r ON r.oid = d.objid \
           WHERE d.classid = 'pg_rewrite'::regclass AND d.refclassid = 'pg_class'::regclass \
             AND r.ev_class <> d.refobjid) \
         SELECT format('%I.%I', n.nspname, c.relname), c.relkind::text, pg_get_viewdef(c.oid) \
         FROM (SELECT DISTINCT oid FROM over) o JOIN pg_class c ON c.oid = o.oid \
         JOIN pg_namespace n ON n.oid = c.relnamespace ORDER BY c.oid",
    )
    .bind(&names)
    .fetch_all(&mut *conn)
    .await?;
    let keys: Vec<String> = sqlx::query_scalar(
        "SELECT format('foreign key %I of table %s', c.conname, c.conrelid::regclass) FROM pg_constraint c \
         WHERE c.contype = 'f' AND c.confrelid = ANY($1::regclass[]) AND NOT c.conrelid = ANY($1::regclass[])",
    )
    .bind(&names)
    .fetch_all(&mut *conn)
    .await?;
    let mut refused: Vec<String> = found
        .iter()
        .filter(|(_, kind, _)| kind != "v")
        .map(|(name, _, _)| format!("materialized view {name}"))
        .collect();
    refused.extend(keys);
    if !refused.is_empty() {
        return Err(Error::rebuild(
            projection,
            format!(
                "the swap cannot carry what depends on the live tables: {}; drop it (and create it again after \
                 the swap), or declare it in the projection's schema()",
                refused.join(", ")
            ),
        ));
    }
    let views: Vec<(String, String)> = found.into_iter().map(|(name, _, definition)| (name, definition)).collect();
    let objects: Vec<&str> = names.iter().map(String::as_str).chain(views.iter().map(|(v, _)| v.as_str())).collect();
    // Each grant but the owner's own, as the statement that makes it again.
    let grants: Vec<String> = sqlx::query_scalar(
        "SELECT format('GRANT %s ON %s TO %s%s', a.privilege_type, o.name, \
           CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(a.grantee)) END, \
           CASE WHEN a.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END) \
         FROM unnest($1::text[]) AS o(name) JOIN pg_class c ON c.oid = o.name::regclass, \
         LATERAL aclexplode(c.relacl) a WHERE a.grantee <> c.relowner",
    )
    .bind(&objects)
    .fetch_all(&mut *conn)
    .await?;
    Ok(Dependents { views, grants })
}

impl Dependents {
    /// Makes the views again over the tables now in place (dropped first, dependents before
    /// what they depend on: anything else depending on a view refuses the swap), then the
    /// grants on views and tables. With `built`, a rebuild's shadow schema and the live one
    /// its tables went to: the views the rebuild made there (the new release's `schema()`)
    /// take the place of the live ones of the same name, and join them, rather than the live
    /// views being made again as the release before defined them.
    pub(crate) async fn carry(&self, conn: &mut PgConnection, built: Option<(&Ident, &Ident)>) -> Result<()> {
        self.drop_views(conn).await?;
        let mut moved: Vec<String> = Vec::new();
        if let Some((shadow, live)) = built {
            // Each view's name as `format('%I')` writes it, as the live views' are.
            let views: Vec<String> = sqlx::query_scalar(
                "SELECT quote_ident(c.relname) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
                 WHERE n.nspname = $1 AND c.relkind = 'v' ORDER BY c.oid",
            )
            .bind(shadow.as_str())
            .fetch_all(&mut *conn)
            .await?;
            for view in views {
                // Where the live view of that name was, else beside the tables.
                let (schema, target) = match self.views.iter().find(|(name, _)| name.ends_with(&format!(".{view}"))) {
                    Some((name, _)) => (name[..name.len() - view.len() - 1].to_owned(), name.clone()),
                    None => (live.to_string(), format!("{live}.{view}")),
                };
                sqlx::raw_sql(&format!("ALTER VIEW {shadow}.{view} SET SCHEMA {schema}")).execute(&mut *conn).await?;
                moved.push(target);
            }
        }
        for (view, definition) in self.views.iter().filter(|(view, _)| !moved.contains(view)) {
            sqlx::raw_sql(&format!("CREATE VIEW {view} AS {definition}")).execute(&mut *conn).await?;
        }
        for grant in &self.grants {
            sqlx::raw_sql(grant).execute(&mut *conn).await?;
        }
        Ok(())
    }

    /// Drops the views (dependents first), unless dropped already.
    pub(crate) async fn drop_views(&self, conn: &mut PgConnection) -> Result<()> {
        for (view, _) in self.views.iter().rev() {
            sqlx::raw_sql(&format!("DROP VIEW IF EXISTS {view}")).execute(&mut *conn).await?;
        }
        Ok(())
    }
}

//! What PostgreSQL says of a table: identifiers checked before any SQL is run, column types
//! as far as the engine needs to know them, and the checks beyond a table's declaration.

pub(crate) mod checks;
pub(crate) mod ident;
pub(crate) mod types;

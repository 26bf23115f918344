//! The schema: the engine's own migrations, a projection's tables created, emptied and
//! checked against their declarations.

pub(crate) mod drift;
pub(crate) mod migrate;

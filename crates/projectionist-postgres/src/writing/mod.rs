//! Writing a batch: planned set-based ([`batch`]), or event by event; parking what cannot be
//! applied yet; a rebuild's folded bulk load; the checkpoint, in the batch's transaction.

pub(crate) mod apply;
pub(crate) mod batch;
pub(crate) mod built_for;
pub mod checkpoint;
pub mod folding;
pub(crate) mod known;
pub(crate) mod parking;
pub(crate) mod shared_rows;
pub mod writer;

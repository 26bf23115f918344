//! What part of its topics an engine reads: all of it (a run's, a rebuild's), or the
//! partitions a few aggregates' keys can be on and those aggregates' events alone (a repair:
//! `rebuild --aggregate`).

use std::collections::BTreeSet;

use crate::tp::Tp;

/// An aggregate: its type and its id.
pub type Aggregate = (String, String);

/// The part of its topics an engine reads (see the module).
#[derive(Debug, Clone, Default)]
pub(crate) struct Scope {
    /// The partitions read; `None`: every partition of the topics.
    pub partitions: Option<BTreeSet<Tp>>,
    /// The aggregates whose events are applied; `None`: every aggregate's.
    pub aggregates: Option<BTreeSet<Aggregate>>,
}

impl Scope {
    /// Whether partition `tp` is read.
    pub(crate) fn reads(&self, tp: &Tp) -> bool {
        self.partitions.as_ref().is_none_or(|p| p.contains(tp))
    }

    /// Whether an event of `aggregate_type`/`aggregate_id` is applied.
    pub(crate) fn keeps(&self, aggregate_type: &str, aggregate_id: &str) -> bool {
        self.aggregates.as_ref().is_none_or(|a| a.iter().any(|(t, id)| t == aggregate_type && id == aggregate_id))
    }

    /// Whether a message that is not an event, about `aggregate` as far as it says (its key,
    /// or `?`), is kept (dead-lettered as the run would): when it may be one of the aggregates'.
    pub(crate) fn keeps_unreadable(&self, aggregate: &str) -> bool {
        self.aggregates.as_ref().is_none_or(|a| a.iter().any(|(_, id)| id == aggregate))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scope_reads_everything_unless_narrowed() {
        let all = Scope::default();
        assert!(all.reads(&Tp::new("t", 3)) && all.keeps("account", "7") && all.keeps_unreadable("?"));
        let narrow = Scope {
            partitions: Some([Tp::new("t", 1)].into()),
            aggregates: Some([("account".to_owned(), "7".to_owned())].into()),
        };
        assert!(narrow.reads(&Tp::new("t", 1)) && !narrow.reads(&Tp::new("t", 2)) && !narrow.reads(&Tp::new("u", 1)));
        assert!(narrow.keeps("account", "7"));
        assert!(!narrow.keeps("customer", "7") && !narrow.keeps("account", "70"));
        assert!(narrow.keeps_unreadable("7") && !narrow.keeps_unreadable("?"));
    }
}

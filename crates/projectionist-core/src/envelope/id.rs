//! An event's id as its producer gave it.

use std::fmt;

use serde::{Serialize, Serializer};
use uuid::Uuid;

/// A producer-minted event id, kept as given: a UUID (what projectionist's own envelope
/// carries, checked as one), or any other text a format carries (CloudEvents allows any
/// string). Not used for deduplication: the aggregate's version is. Shown and serialised as
/// text.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum EventId {
    /// A UUID.
    Uuid(Uuid),
    /// Any other id, as given.
    Text(Box<str>),
}

impl EventId {
    /// The id as a UUID, when it is one.
    pub fn as_uuid(&self) -> Option<Uuid> {
        match self {
            Self::Uuid(id) => Some(*id),
            Self::Text(_) => None,
        }
    }

    /// The id given as `text`, kept as it is (a UUID's text too: its spelling is kept).
    pub fn text(text: impl Into<Box<str>>) -> Self {
        Self::Text(text.into())
    }
}

impl From<Uuid> for EventId {
    fn from(id: Uuid) -> Self {
        Self::Uuid(id)
    }
}

impl PartialEq<Uuid> for EventId {
    fn eq(&self, other: &Uuid) -> bool {
        self.as_uuid() == Some(*other)
    }
}

impl fmt::Display for EventId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Uuid(id) => id.fmt(f),
            Self::Text(text) => f.write_str(text),
        }
    }
}

impl Serialize for EventId {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_is_shown_and_serialised_as_given() {
        let uuid = Uuid::from_u128(0x6f1c_2d9e_8a6b_4c1e_9d0a_2b3c_4d5e_6f70);
        let ids =
            [EventId::from(uuid), EventId::text("order-17/3"), EventId::text("6F1C2D9E-8A6B-4C1E-9D0A-2B3C4D5E6F70")];
        let shown: Vec<String> = ids.iter().map(ToString::to_string).collect();
        assert_eq!(
            shown,
            ["6f1c2d9e-8a6b-4c1e-9d0a-2b3c4d5e6f70", "order-17/3", "6F1C2D9E-8A6B-4C1E-9D0A-2B3C4D5E6F70"]
        );
        assert_eq!(serde_json::to_string(&ids[1]).unwrap(), r#""order-17/3""#);
        assert_eq!(ids[0], uuid);
        assert_eq!(ids[1].as_uuid(), None);
    }
}

//! A row's identity as the planner's map of rows holds it.

/// How many bytes of a row's key and child key, together, the map holds inline.
const INLINE: usize = 30;

/// A row of the pass: its table's place, its key and child key ("" but in child tables).
///
/// Short keys (most are) are held inline, so that finding a row met before compares bytes
/// beside the map's slot, not the key of the event that first wrote the row: in a batch of
/// tens of thousands of events that event has long left the cache, and reading its key cost
/// 7 % of the projector's CPU at batches of 50,000. Longer keys are held by reference.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct RowId<'a>(usize, Bytes<'a>);

/// A pair of keys is held one way only (by its total length), so equal pairs are equal
/// `Bytes`: inline, the same lengths and bytes (the rest zero).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Bytes<'a> {
    Inline { key: u8, child: u8, bytes: [u8; INLINE] },
    Borrowed(&'a str, &'a str),
}

impl<'a> RowId<'a> {
    pub(super) fn new(table: usize, key: &'a str, child: &'a str) -> Self {
        let len = key.len() + child.len();
        if len > INLINE {
            return RowId(table, Bytes::Borrowed(key, child));
        }
        let mut bytes = [0; INLINE];
        bytes[..key.len()].copy_from_slice(key.as_bytes());
        bytes[key.len()..len].copy_from_slice(child.as_bytes());
        // Both at most INLINE (30) long: they fit a u8.
        RowId(table, Bytes::Inline { key: key.len() as u8, child: child.len() as u8, bytes })
    }
}

#[cfg(test)]
mod tests {
    use super::RowId;

    #[test]
    fn a_row_is_the_same_row_only_with_the_same_table_key_and_child() {
        let long = "k".repeat(40);
        assert!(RowId::new(0, "a", "b") == RowId::new(0, "a", "b"));
        assert!(RowId::new(0, &long, "") == RowId::new(0, &long.clone(), ""));
        // The split between key and child counts, not only their bytes together.
        assert!(RowId::new(0, "ab", "") != RowId::new(0, "a", "b"));
        assert!(RowId::new(0, "a", "") != RowId::new(1, "a", ""));
        assert!(RowId::new(0, "a", "") != RowId::new(0, "a\0", ""));
        assert!(RowId::new(0, &long[..30], "") != RowId::new(0, &long[..31], ""));
    }
}

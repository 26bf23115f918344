//! Discovering which event type names a serde enum accepts, without the author listing them.

use std::any::TypeId;
use std::collections::HashMap;
use std::fmt;
use std::sync::{Mutex, OnceLock};

use serde::de::value::MapDeserializer;
use serde::de::DeserializeOwned;

/// The variant names (event `type` tags) the serde enum `E` accepts, or `None` when `E` is
/// not an enum tagged by `type` (then every event is offered to it).
///
/// Found by asking `E` to deserialise an impossible tag and reading the list of expected
/// variants out of serde's own `unknown_variant` error. Cached per type.
pub fn event_types<E: DeserializeOwned + 'static>() -> Option<&'static [&'static str]> {
    type Variants = Option<&'static [&'static str]>;
    static CACHE: OnceLock<Mutex<HashMap<TypeId, Variants>>> = OnceLock::new();
    let id = TypeId::of::<E>();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(found) = cache.lock().expect("event type cache poisoned").get(&id) {
        return *found;
    }
    let probe = MapDeserializer::<_, Probe>::new([("type", "\u{0}projectionist-probe")].into_iter());
    let found = match E::deserialize(probe) {
        Err(Probe(Some(variants))) => Some(variants),
        _ => None,
    };
    cache.lock().expect("event type cache poisoned").insert(id, found);
    found
}

#[derive(Debug)]
struct Probe(Option<&'static [&'static str]>);

impl fmt::Display for Probe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("probe")
    }
}

impl std::error::Error for Probe {}

impl serde::de::Error for Probe {
    fn custom<T: fmt::Display>(_msg: T) -> Self {
        Probe(None)
    }
    fn unknown_variant(_variant: &str, expected: &'static [&'static str]) -> Self {
        Probe(Some(expected))
    }
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    #[derive(Deserialize)]
    #[serde(tag = "type", content = "data")]
    #[allow(dead_code)]
    enum Adjacent {
        A { x: i64 },
        B {},
    }

    #[derive(Deserialize)]
    #[serde(tag = "type")]
    #[allow(dead_code)]
    enum Internal {
        C { y: String },
    }

    #[test]
    fn lists_the_variants_of_tagged_enums() {
        assert_eq!(super::event_types::<Adjacent>(), Some(&["A", "B"][..]));
        assert_eq!(super::event_types::<Internal>(), Some(&["C"][..]));
        assert_eq!(super::event_types::<serde_json::Value>(), None);
    }
}

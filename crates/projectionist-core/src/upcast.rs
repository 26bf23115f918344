//! Upcasting: old shapes of an event turned into the current one, on the JSON, before the
//! event is decoded into the projection's enum.
//!
//! A long-lived topic holds events written by every release of their producer. Rather than
//! keep every old shape in the enum, a projection registers [`Upcaster`]s: each reads one
//! event type at one schema version and returns the next version's data (and, if the type
//! was renamed, its new name). They are chained, oldest first, until no upcaster reads what
//! came out. The schema version of an event is its envelope's `metadata.schema_version` (an
//! integer ≥ 1), 1 when absent. They run wherever an event is decoded: the live path and
//! replays alike.
//!
//! Because an absent version is 1, a version-1 upcaster also runs on every event whose
//! producer stamps no version, today's included: stamp the new number from the producer's
//! release that changes the shape, and let an upcaster pass data already in the new shape
//! through unchanged (docs/projections.md, "Old shapes of an event").

use serde_json::Value;

use crate::error::DecodeError;

/// The envelope's metadata field holding the event's schema version.
pub const SCHEMA_VERSION_FIELD: &str = "schema_version";

/// The most upcasters one event passes through: a chain longer than this is a loop.
const MAX_CHAIN: u32 = 64;

/// Turns one event type's data at one schema version into the next version's.
///
/// ```
/// use projectionist_core::Upcaster;
/// use serde_json::Value;
///
/// /// Version 1 of MoneyDeposited carried `cents`; version 2 calls it `amount`.
/// fn cents_to_amount(mut data: Value) -> Result<Value, String> {
///     let cents = data.as_object_mut().and_then(|d| d.remove("cents")).ok_or("no `cents`")?;
///     data["amount"] = cents;
///     Ok(data)
/// }
///
/// const UPCASTERS: &[Upcaster] = &[
///     Upcaster::new("MoneyDeposited", 1, cents_to_amount),
///     // `FundsAdded` was the name of version 1 and 2; version 3 is `MoneyDeposited`.
///     Upcaster::new("FundsAdded", 2, Upcaster::same).renamed("MoneyDeposited"),
/// ];
/// ```
#[derive(Clone, Copy)]
pub struct Upcaster {
    event_type: &'static str,
    schema_version: u32,
    upcast: fn(Value) -> Result<Value, String>,
    renamed: Option<&'static str>,
}

impl Upcaster {
    /// An upcaster of `event_type`'s data at `schema_version` to `schema_version + 1`.
    /// `upcast` returns an error (a reason) for data it cannot read: the event is then
    /// poison, as data that does not decode is.
    pub const fn new(
        event_type: &'static str,
        schema_version: u32,
        upcast: fn(Value) -> Result<Value, String>,
    ) -> Self {
        Self { event_type, schema_version, upcast, renamed: None }
    }

    /// The event's type after this step is `event_type` (its chain goes on under that name,
    /// at the next schema version).
    pub const fn renamed(mut self, event_type: &'static str) -> Self {
        self.renamed = Some(event_type);
        self
    }

    /// The data as it is: for a step that only renames the type.
    pub fn same(data: Value) -> Result<Value, String> {
        Ok(data)
    }

    /// The event type this upcaster reads.
    pub const fn event_type(&self) -> &'static str {
        self.event_type
    }

    /// The schema version this upcaster reads.
    pub const fn schema_version(&self) -> u32 {
        self.schema_version
    }
}

impl std::fmt::Debug for Upcaster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upcaster")
            .field("event_type", &self.event_type)
            .field("schema_version", &self.schema_version)
            .field("renamed", &self.renamed)
            .finish_non_exhaustive()
    }
}

/// The schema version of an event, from its envelope's metadata (1 when absent).
pub fn schema_version(metadata: Option<&Value>) -> Result<u32, DecodeError> {
    match metadata.and_then(|m| m.get(SCHEMA_VERSION_FIELD)) {
        None | Some(Value::Null) => Ok(1),
        Some(v) => {
            v.as_u64().and_then(|v| u32::try_from(v).ok()).filter(|v| *v >= 1).ok_or_else(|| DecodeError::Field {
                field: "metadata",
                problem: format!("`{SCHEMA_VERSION_FIELD}` must be an integer >= 1, got {v}"),
            })
        }
    }
}

/// Passes `event_type`'s `data` through the `upcasters` that apply, oldest first, starting
/// at the schema version in `metadata`. The type and data are left as they are when none
/// applies (the usual case, and free).
pub fn upcast(
    upcasters: &[Upcaster],
    event_type: &mut String,
    data: &mut Value,
    metadata: Option<&Value>,
) -> Result<(), DecodeError> {
    if upcasters.is_empty() {
        return Ok(());
    }
    let mut version = schema_version(metadata)?;
    for _ in 0..MAX_CHAIN {
        let Some(step) = upcasters.iter().find(|u| u.schema_version == version && u.event_type == event_type) else {
            return Ok(());
        };
        *data = (step.upcast)(std::mem::take(data)).map_err(|reason| DecodeError::Upcast {
            event_type: event_type.clone(),
            schema_version: version,
            reason,
        })?;
        if let Some(renamed) = step.renamed {
            renamed.clone_into(event_type);
        }
        version += 1;
    }
    Err(DecodeError::Upcast {
        event_type: event_type.clone(),
        schema_version: version,
        reason: format!("more than {MAX_CHAIN} upcasters in a row: the upcasters form a loop"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cents_to_amount(mut data: Value) -> Result<Value, String> {
        let cents = data.as_object_mut().and_then(|d| d.remove("cents")).ok_or("no `cents`")?;
        data["amount"] = cents;
        Ok(data)
    }

    fn doubled(mut data: Value) -> Result<Value, String> {
        data["amount"] = json!(data["amount"].as_i64().ok_or("no amount")? * 2);
        Ok(data)
    }

    const CHAIN: &[Upcaster] = &[
        Upcaster::new("FundsAdded", 1, cents_to_amount).renamed("MoneyDeposited"),
        Upcaster::new("MoneyDeposited", 2, doubled),
    ];

    fn run(event_type: &str, data: Value, metadata: Option<Value>) -> Result<(String, Value), DecodeError> {
        let (mut event_type, mut data) = (event_type.to_owned(), data);
        upcast(CHAIN, &mut event_type, &mut data, metadata.as_ref())?;
        Ok((event_type, data))
    }

    #[test]
    fn old_shapes_pass_through_the_chain_from_their_schema_version() {
        assert_eq!(
            run("FundsAdded", json!({"cents": 5}), None).unwrap(),
            ("MoneyDeposited".into(), json!({"amount": 10}))
        );
        let v2 = Some(json!({"schema_version": 2}));
        assert_eq!(
            run("MoneyDeposited", json!({"amount": 5}), v2).unwrap(),
            ("MoneyDeposited".into(), json!({"amount": 10}))
        );
        let v3 = Some(json!({"schema_version": 3, "trace": "t"}));
        assert_eq!(run("MoneyDeposited", json!({"amount": 5}), v3).unwrap().1, json!({"amount": 5}), "current");
        assert_eq!(run("Other", json!({"x": 1}), None).unwrap(), ("Other".into(), json!({"x": 1})));
    }

    #[test]
    fn a_failing_upcaster_or_a_bad_schema_version_is_poison_naming_it() {
        let err = run("FundsAdded", json!({"amount": 5}), None).unwrap_err().to_string();
        assert_eq!(err, "upcasting event type FundsAdded from schema version 1: no `cents`");
        let err = run("FundsAdded", json!({}), Some(json!({"schema_version": 0}))).unwrap_err().to_string();
        assert!(err.contains("`schema_version` must be an integer >= 1, got 0"), "{err}");
        let stuck: Vec<Upcaster> = (1..=MAX_CHAIN + 1).map(|v| Upcaster::new("A", v, Upcaster::same)).collect();
        let (mut event_type, mut data) = ("A".to_owned(), json!({}));
        let err = upcast(&stuck, &mut event_type, &mut data, None).unwrap_err().to_string();
        assert!(err.contains("form a loop"), "{err}");
    }
}

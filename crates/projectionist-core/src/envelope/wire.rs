//! An envelope checked as it arrives: every field read as whatever JSON it is, so that an
//! envelope that does not fit is refused naming the field and the problem.

use std::borrow::Cow;

use chrono::{DateTime, Utc};
use serde::de::{DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;
use uuid::Uuid;

use super::RawEnvelope;
use crate::error::DecodeError;

/// Decodes and validates an envelope from JSON bytes, its data read as `D`.
pub(super) fn from_slice<'a, D: Deserialize<'a>>(bytes: &'a [u8]) -> Result<Checked<D>, DecodeError> {
    // serde would also read an array into the struct: only an object is an envelope.
    let object = bytes.trim_ascii_start().first() == Some(&b'{');
    // The whole message checked as UTF-8 at once, then read as text: serde_json then checks
    // no string again (bytes that are not UTF-8 are read as bytes, for serde's error).
    let wire = match std::str::from_utf8(bytes) {
        Ok(text) => serde_json::from_str::<Wire<'_, D>>(text),
        Err(_) => serde_json::from_slice::<Wire<'_, D>>(bytes),
    };
    match wire {
        Ok(wire) if object => wire.validate(),
        // Not an object, or not JSON: say which.
        Err(e) => match serde_json::from_slice::<Value>(bytes) {
            Ok(value) if !value.is_object() => Err(DecodeError::NotAnObject(json_kind(&value))),
            _ => Err(DecodeError::Json(e.to_string())),
        },
        Ok(_) => match serde_json::from_slice::<Value>(bytes) {
            Ok(value) => Err(DecodeError::NotAnObject(json_kind(&value))),
            Err(e) => Err(DecodeError::Json(e.to_string())),
        },
    }
}

/// Decodes and validates an envelope from JSON bytes, its data kept as its JSON text: first
/// as producers write envelopes ([`Plain`]), then, for one that does not read so, as
/// [`from_slice`] does, which names the problem (or takes what `Plain` does not: escapes).
pub(super) fn lazy_from_slice(bytes: &[u8]) -> Result<Checked<Box<RawValue>>, DecodeError> {
    let plain = std::str::from_utf8(bytes)
        .ok()
        .filter(|text| text.trim_ascii_start().starts_with('{'))
        .and_then(|text| serde_json::from_str::<Plain<'_>>(text).ok())
        .and_then(Plain::checked);
    // Kept as text, `data` was only skipped over, which takes what a `Value` refuses (a
    // number out of range, a lone surrogate, nesting past 128 levels): it is read as a
    // `Value` is read. What does not read so is refused as the whole reading refuses it,
    // with its error (which names the first problem of the message, wherever it is).
    let checked = plain.or_else(|| from_slice::<Box<RawValue>>(bytes).ok()).filter(|c| is_a_value(c.data.get()));
    match checked {
        Some(checked) => Ok(checked),
        None => Err(match from_slice::<Value>(bytes) {
            Err(e) => e,
            Ok(_) => DecodeError::Json("data is not a JSON value".into()),
        }),
    }
}

/// Whether `text` (JSON by its grammar), a field of the envelope, reads as a [`Value`] in
/// it: walked as `Value` is read (every number, string and key parsed), without building
/// the tree, its nesting counted from the envelope's (serde_json's limit of 128 levels).
pub(super) fn is_a_value(text: &str) -> bool {
    let mut de = serde_json::Deserializer::from_str(text);
    Nested(MAX_NESTED - 1).deserialize(&mut de).and_then(|()| de.end()).is_ok()
}

/// How deep serde_json reads containers within each other (its recursion limit, less one).
const MAX_NESTED: u8 = 127;

/// A value read as [`Value`] reads it, kept as nothing, with room for this many more
/// containers within it.
struct Nested(u8);

impl<'de> DeserializeSeed<'de> for Nested {
    type Value = ();

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl Nested {
    fn inner<E: serde::de::Error>(&self) -> Result<Nested, E> {
        match self.0.checked_sub(1) {
            Some(room) => Ok(Nested(room)),
            None => Err(E::custom("recursion limit exceeded")),
        }
    }
}

impl<'de> Visitor<'de> for Nested {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let inner = self.inner()?;
        while seq.next_element_seed(Nested(inner.0))?.is_some() {}
        Ok(())
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let inner = self.inner()?;
        while map.next_key_seed(Nested(0))?.is_some() {
            map.next_value_seed(Nested(inner.0))?;
        }
        Ok(())
    }
}

/// An envelope read straight into its fields, each of the kind it must be, its strings
/// without escapes (borrowed from the bytes): how producers write them. Cheaper than
/// [`Wire`], which reads each field as whatever JSON it is so as to name what is wrong; an
/// envelope this does not take, or that [`Plain::checked`] refuses, is read again by it.
#[derive(serde::Deserialize)]
struct Plain<'a> {
    id: &'a str,
    aggregate_type: &'a str,
    aggregate_id: &'a str,
    version: i64,
    #[serde(rename = "type")]
    event_type: &'a str,
    occurred_at: &'a str,
    #[serde(borrow)]
    data: &'a RawValue,
    #[serde(borrow, default)]
    metadata: Option<&'a RawValue>,
}

impl Plain<'_> {
    /// The envelope if [`Wire::validate`] would take it as it is (`None`: let it say why not).
    fn checked(self) -> Option<Checked<Box<RawValue>>> {
        let key = |s: &str| key_problem(s).is_none().then(|| s.to_owned());
        let metadata = match self.metadata {
            None => None,
            Some(m) if m.get().starts_with('{') && is_a_value(m.get()) => Some(serde_json::from_str(m.get()).ok()?),
            Some(_) => return None,
        };
        Some(Checked {
            id: Uuid::parse_str(self.id).ok()?,
            aggregate_type: key(self.aggregate_type)?,
            aggregate_id: key(self.aggregate_id)?,
            version: Some(self.version).filter(|&v| v >= 1)?,
            event_type: Some(self.event_type).filter(|t| !t.trim().is_empty())?.to_owned(),
            occurred_at: DateTime::parse_from_rfc3339(self.occurred_at).ok()?.with_timezone(&Utc),
            data: self.data.to_owned(),
            metadata,
        })
    }
}

/// An envelope's fields, validated, its data read as `D`.
pub(super) struct Checked<D> {
    pub(super) id: Uuid,
    pub(super) aggregate_type: String,
    pub(super) aggregate_id: String,
    pub(super) version: i64,
    pub(super) event_type: String,
    pub(super) occurred_at: DateTime<Utc>,
    pub(super) data: D,
    pub(super) metadata: Option<Value>,
}

impl Checked<Value> {
    pub(super) fn into_raw(self) -> RawEnvelope {
        let (id, aggregate_type, aggregate_id, version) =
            (self.id, self.aggregate_type, self.aggregate_id, self.version);
        let (event_type, occurred_at, data, metadata) = (self.event_type, self.occurred_at, self.data, self.metadata);
        let id = id.into();
        RawEnvelope { id, aggregate_type, aggregate_id, version, event_type, occurred_at, data, metadata }
    }
}

/// The envelope as it arrives: every field kept as whatever JSON it is, so that checking it
/// names the field and the problem (serde's own errors would name a position instead).
/// Strings are borrowed from the bytes where they hold no escapes; `data` is read as `D`
/// (a `Value` tree, or its JSON text).
#[derive(serde::Deserialize)]
#[serde(bound(deserialize = "D: Deserialize<'de>"))]
pub(super) struct Wire<'a, D = Value> {
    #[serde(borrow, default)]
    id: Scalar<'a>,
    #[serde(borrow, default)]
    aggregate_type: Scalar<'a>,
    #[serde(borrow, default)]
    aggregate_id: Scalar<'a>,
    #[serde(borrow, default)]
    version: Scalar<'a>,
    #[serde(borrow, default, rename = "type")]
    event_type: Scalar<'a>,
    #[serde(borrow, default)]
    occurred_at: Scalar<'a>,
    #[serde(default, deserialize_with = "present")]
    data: Option<D>,
    #[serde(default)]
    metadata: Option<Value>,
}

/// A field that is there, even as `null` (`Option<Value>` alone reads `null` as absent).
fn present<'de, De: serde::Deserializer<'de>, T: Deserialize<'de>>(d: De) -> Result<Option<T>, De::Error> {
    T::deserialize(d).map(Some)
}

impl<D> Wire<'_, D> {
    pub(super) fn validate(self) -> Result<Checked<D>, DecodeError> {
        let id = self.id.string("id")?;
        let id = Uuid::parse_str(&id).map_err(|e| DecodeError::field("id", format!("not a UUID ({e}): {id:?}")))?;
        let aggregate_type = self.aggregate_type.key("aggregate_type")?;
        let aggregate_id = self.aggregate_id.key("aggregate_id")?;
        let version = match self.version {
            Scalar::Null => return Err(DecodeError::missing("version")),
            Scalar::Number(n) => match n.as_i64() {
                Some(v) if v >= 1 => v,
                Some(v) => return Err(DecodeError::field("version", format!("must be >= 1, got {v}"))),
                None => return Err(DecodeError::field("version", format!("must be an integer >= 1, got {n}"))),
            },
            other => {
                let kind = other.kind();
                return Err(DecodeError::field("version", format!("must be an integer >= 1, got {kind}")));
            }
        };
        let event_type = self.event_type.nonempty("type")?;
        let occurred_at = self.occurred_at.string("occurred_at")?;
        let occurred_at = DateTime::parse_from_rfc3339(&occurred_at)
            .map_err(|e| {
                DecodeError::field("occurred_at", format!("not an RFC 3339 timestamp ({e}): {occurred_at:?}"))
            })?
            .with_timezone(&Utc);
        let data = self.data.ok_or_else(|| DecodeError::missing("data"))?;
        let metadata = match self.metadata {
            None | Some(Value::Null) => None,
            Some(v @ Value::Object(_)) => Some(v),
            Some(other) => {
                return Err(DecodeError::field("metadata", format!("must be an object, got {}", json_kind(&other))))
            }
        };
        Ok(Checked { id, aggregate_type, aggregate_id, version, event_type, occurred_at, data, metadata })
    }
}

/// An envelope field of any JSON kind (absent reads as `Null`); only strings and numbers
/// keep their value.
#[derive(Default)]
enum Scalar<'a> {
    #[default]
    Null,
    Bool,
    Number(serde_json::Number),
    String(Cow<'a, str>),
    Array,
    Object,
}

impl<'a> Scalar<'a> {
    fn kind(&self) -> &'static str {
        match self {
            Self::Null => "null",
            Self::Bool => "a boolean",
            Self::Number(_) => "a number",
            Self::String(_) => "a string",
            Self::Array => "an array",
            Self::Object => "an object",
        }
    }

    fn string(self, field: &'static str) -> Result<Cow<'a, str>, DecodeError> {
        match self {
            Self::Null => Err(DecodeError::missing(field)),
            Self::String(s) => Ok(s),
            other => Err(DecodeError::field(field, format!("must be a string, got {}", other.kind()))),
        }
    }

    fn nonempty(self, field: &'static str) -> Result<String, DecodeError> {
        let s = self.string(field)?;
        if s.trim().is_empty() {
            return Err(DecodeError::field(field, "must not be empty"));
        }
        Ok(s.into_owned())
    }

    /// A non-empty string the engine can store as a key (see [`crate::MAX_KEY_BYTES`]).
    fn key(self, field: &'static str) -> Result<String, DecodeError> {
        let s = self.string(field)?;
        match key_problem(&s) {
            Some(problem) => Err(DecodeError::field(field, problem)),
            None => Ok(s.into_owned()),
        }
    }
}

impl<'de: 'a, 'a> serde::Deserialize<'de> for Scalar<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ScalarVisitor(std::marker::PhantomData))
    }
}

struct ScalarVisitor<'a>(std::marker::PhantomData<&'a ()>);

impl<'de: 'a, 'a> Visitor<'de> for ScalarVisitor<'a> {
    type Value = Scalar<'a>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_unit<E>(self) -> Result<Scalar<'a>, E> {
        Ok(Scalar::Null)
    }
    fn visit_none<E>(self) -> Result<Scalar<'a>, E> {
        Ok(Scalar::Null)
    }
    fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Scalar<'a>, D::Error> {
        d.deserialize_any(self)
    }
    fn visit_bool<E>(self, _: bool) -> Result<Scalar<'a>, E> {
        Ok(Scalar::Bool)
    }
    fn visit_i64<E>(self, v: i64) -> Result<Scalar<'a>, E> {
        Ok(Scalar::Number(v.into()))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Scalar<'a>, E> {
        Ok(Scalar::Number(v.into()))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Scalar<'a>, E> {
        Ok(serde_json::Number::from_f64(v).map_or(Scalar::Null, Scalar::Number))
    }
    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Scalar<'a>, E> {
        Ok(Scalar::String(Cow::Borrowed(v)))
    }
    fn visit_str<E>(self, v: &str) -> Result<Scalar<'a>, E> {
        Ok(Scalar::String(Cow::Owned(v.to_owned())))
    }
    fn visit_string<E>(self, v: String) -> Result<Scalar<'a>, E> {
        Ok(Scalar::String(Cow::Owned(v)))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Scalar<'a>, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Scalar::Array)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Scalar<'a>, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Scalar::Object)
    }
}

/// Why `s` cannot be an aggregate's type or id, if it cannot: empty (or blank), or not a key
/// the engine can store.
pub(super) fn key_problem(s: &str) -> Option<String> {
    if s.trim().is_empty() {
        return Some("must not be empty".to_owned());
    }
    crate::check_key("the value", s).err()
}

pub(super) fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

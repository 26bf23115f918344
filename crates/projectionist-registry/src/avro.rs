//! Avro: the writer's schema (with its references), optionally resolved against a reader's,
//! and the datum as the JSON a serde type reads.

use std::collections::HashMap;

use apache_avro::{
    schema::{Name, RecordSchema},
    types::Value,
    Schema,
};
use base64::Engine as _;
use chrono::{DateTime, NaiveDate, NaiveTime, SecondsFormat};
use serde::{Serialize, Serializer};
use serde_json::Value as Json;

/// A compiled Avro schema and the named types it can refer to.
#[derive(Debug)]
pub(crate) struct AvroSchema {
    schema: Schema,
    /// The referenced schemas, for names the main one uses but does not define.
    schemata: Vec<Schema>,
    names: HashMap<Name, Schema>,
}

impl AvroSchema {
    /// Parses `text`, whose named types may come from `references` (their texts).
    pub fn parse(text: &str, references: &[String]) -> Result<Self, String> {
        let (schema, schemata) = if references.is_empty() {
            (Schema::parse_str(text).map_err(|e| e.to_string())?, Vec::new())
        } else {
            Schema::parse_str_with_list(text, references).map_err(|e| e.to_string())?
        };
        let mut names = HashMap::new();
        for s in schemata.iter().chain([&schema]) {
            collect_names(s, &mut names);
        }
        Ok(Self { schema, schemata, names })
    }

    /// The datum in `payload` as JSON: written with this schema, read with `reader`'s when
    /// given (Avro's schema resolution: defaults for added fields, removed ones dropped).
    #[cfg(test)]
    pub fn decode(&self, payload: &[u8], reader: Option<&AvroSchema>) -> Result<Json, String> {
        self.decode_into(payload, reader, serde_json::value::Serializer)
    }

    /// [`AvroSchema::decode`] into any serde serializer (JSON text, without a `Value` between).
    pub fn decode_into<S: Serializer>(
        &self,
        payload: &[u8],
        reader: Option<&AvroSchema>,
        into: S,
    ) -> Result<S::Ok, String> {
        let mut input = Input { rest: payload, ended: false };
        let value = apache_avro::from_avro_datum_reader_schemata(
            &self.schema,
            self.schemata.iter().collect(),
            &mut input,
            reader.map(|r| &r.schema),
            reader.map(|r| r.schemata.iter().collect()).unwrap_or_default(),
        );
        // apache-avro reads a string or a union index cut short as null: the input tells.
        let value = match value {
            Ok(_) if input.ended => Err(self.locate(payload, "the bytes end early")),
            Ok(_) if !input.rest.is_empty() => Err(format!("{} bytes left after the datum", input.rest.len())),
            Ok(value) => Ok(value),
            Err(e) if input.ended => Err(self.locate(payload, &format!("the bytes end early ({e})"))),
            Err(e) if reader.is_some() => Err(format!("read with the reader's schema: {e}")),
            Err(e) => Err(self.locate(payload, &e.to_string())),
        }?;
        let shape = reader.unwrap_or(self);
        AsJson { avro: shape, value: &value, schema: Some(&shape.schema) }.serialize(into).map_err(|e| e.to_string())
    }

    /// `reason`, with the record's field where decoding stops, field by field.
    fn locate(&self, payload: &[u8], reason: &str) -> String {
        let Schema::Record(record) = &self.schema else { return reason.to_owned() };
        let mut input = Input { rest: payload, ended: false };
        let schemata: Vec<&Schema> = self.schemata.iter().chain([&self.schema]).collect();
        for field in &record.fields {
            let read = apache_avro::from_avro_datum_schemata(&field.schema, schemata.clone(), &mut input, None);
            if read.is_err() || input.ended {
                return format!("field `{}`: {reason}", field.name);
            }
        }
        reason.to_owned()
    }

    /// A named type's schema where `schema` refers to one by name.
    fn resolve<'a>(&'a self, schema: Option<&'a Schema>) -> Option<&'a Schema> {
        schema.and_then(|s| match s {
            Schema::Ref { name } => self.names.get(name),
            other => Some(other),
        })
    }
}

/// A decoded value as the JSON a serde type reads, guided by its schema where one is known
/// (a union's branch, a decimal's scale).
struct AsJson<'a> {
    avro: &'a AvroSchema,
    value: &'a Value,
    schema: Option<&'a Schema>,
}

impl Serialize for AsJson<'_> {
    fn serialize<S: Serializer>(&self, into: S) -> Result<S::Ok, S::Error> {
        let schema = self.avro.resolve(self.schema);
        let nested = |value, schema| AsJson { avro: self.avro, value, schema };
        match (self.value, schema) {
            (Value::Null, _) => into.serialize_unit(),
            (Value::Boolean(b), _) => into.serialize_bool(*b),
            (Value::Int(i), _) => into.serialize_i32(*i),
            (Value::Long(l), _) => into.serialize_i64(*l),
            (Value::String(text) | Value::Enum(_, text), _) => into.serialize_str(text),
            (Value::Union(branch, inner), Some(Schema::Union(union))) => {
                nested(inner, union.variants().get(*branch as usize)).serialize(into)
            }
            (Value::Union(_, inner), _) => nested(inner, None).serialize(into),
            (Value::Array(items), schema) => {
                let item = match schema {
                    Some(Schema::Array(array)) => Some(&*array.items),
                    _ => None,
                };
                into.collect_seq(items.iter().map(|v| nested(v, item)))
            }
            (Value::Map(entries), schema) => {
                let item = match schema {
                    Some(Schema::Map(map)) => Some(&*map.types),
                    _ => None,
                };
                into.collect_map(entries.iter().map(|(k, v)| (k, nested(v, item))))
            }
            (Value::Record(fields), schema) => {
                let record = match schema {
                    Some(Schema::Record(record)) => Some(record),
                    _ => None,
                };
                let field = |name: &str| record.and_then(|r| field_schema(r, name));
                into.collect_map(fields.iter().map(|(name, v)| (name, nested(v, field(name)))))
            }
            (other, schema) => scalar(other, schema).serialize(into),
        }
    }
}

/// The values written as text or as a JSON number computed from them.
fn scalar(value: &Value, schema: Option<&Schema>) -> Json {
    match value {
        Value::Date(days) => date(*days),
        Value::Float(f) => float(f64::from(*f)),
        Value::Double(d) => float(*d),
        Value::Bytes(b) | Value::Fixed(_, b) => base64::engine::general_purpose::STANDARD.encode(b).into(),
        Value::Uuid(u) => u.to_string().into(),
        Value::Decimal(d) => {
            let scale = match schema {
                Some(Schema::Decimal(decimal)) => decimal.scale,
                _ => 0,
            };
            decimal_text(&num_bigint::BigInt::from(d.clone()).to_string(), scale).into()
        }
        Value::BigDecimal(d) => d.to_string().into(),
        Value::TimeMillis(ms) => time(i64::from(*ms), 1_000_000, "%H:%M:%S%.3f"),
        Value::TimeMicros(us) => time(*us, 1_000, "%H:%M:%S%.6f"),
        Value::TimestampMillis(ms) => instant(DateTime::from_timestamp_millis(*ms), *ms, SecondsFormat::Millis),
        Value::TimestampMicros(us) => instant(DateTime::from_timestamp_micros(*us), *us, SecondsFormat::Micros),
        Value::TimestampNanos(ns) => instant(Some(DateTime::from_timestamp_nanos(*ns)), *ns, SecondsFormat::Nanos),
        Value::LocalTimestampMillis(ms) => local(DateTime::from_timestamp_millis(*ms), *ms, "%.3f"),
        Value::LocalTimestampMicros(us) => local(DateTime::from_timestamp_micros(*us), *us, "%.6f"),
        Value::LocalTimestampNanos(ns) => local(Some(DateTime::from_timestamp_nanos(*ns)), *ns, "%.9f"),
        Value::Duration(d) => serde_json::json!({
            "months": u32::from(d.months()), "days": u32::from(d.days()), "millis": u32::from(d.millis()),
        }),
        // The rest is written by `AsJson` itself, never here.
        _ => Json::Null,
    }
}

/// The payload as apache-avro reads it, noting whether it wanted more bytes than there are.
struct Input<'a> {
    rest: &'a [u8],
    ended: bool,
}

impl std::io::Read for Input<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.rest.is_empty() && !buf.is_empty() {
            self.ended = true;
        }
        self.rest.read(buf)
    }
}

fn field_schema<'a>(record: &'a RecordSchema, name: &str) -> Option<&'a Schema> {
    record.lookup.get(name).and_then(|i| record.fields.get(*i)).map(|f| &f.schema)
}

/// Every named type (record, enum, fixed) in `schema`, by its full name.
fn collect_names(schema: &Schema, names: &mut HashMap<Name, Schema>) {
    match schema {
        Schema::Record(record) => {
            names.insert(record.name.clone(), schema.clone());
            record.fields.iter().for_each(|f| collect_names(&f.schema, names));
        }
        Schema::Enum(e) => drop(names.insert(e.name.clone(), schema.clone())),
        Schema::Fixed(f) => drop(names.insert(f.name.clone(), schema.clone())),
        Schema::Decimal(d) => collect_names(&d.inner, names),
        Schema::Array(a) => collect_names(&a.items, names),
        Schema::Map(m) => collect_names(&m.types, names),
        Schema::Union(u) => u.variants().iter().for_each(|v| collect_names(v, names)),
        _ => {}
    }
}

/// A float as a JSON number; NaN and the infinities, which JSON lacks, as Avro's JSON text.
fn float(f: f64) -> Json {
    serde_json::Number::from_f64(f).map_or_else(
        || {
            Json::String(
                if f.is_nan() {
                    "NaN"
                } else if f > 0.0 {
                    "Infinity"
                } else {
                    "-Infinity"
                }
                .into(),
            )
        },
        Json::Number,
    )
}

/// An unscaled integer's digits with a decimal point `scale` digits from the right.
fn decimal_text(digits: &str, scale: usize) -> String {
    let (sign, digits) = digits.strip_prefix('-').map_or(("", digits), |d| ("-", d));
    if scale == 0 {
        return format!("{sign}{digits}");
    }
    let padded = format!("{digits:0>width$}", width = scale + 1);
    let (whole, fraction) = padded.split_at(padded.len() - scale);
    format!("{sign}{whole}.{fraction}")
}

fn date(days: i32) -> Json {
    let epoch = NaiveDate::from_ymd_opt(1970, 1, 1).unwrap_or_default();
    epoch.checked_add_signed(chrono::Duration::days(i64::from(days))).map_or(days.into(), |d| d.to_string().into())
}

/// A time of day (`raw` units of `unit` nanoseconds since midnight) as `HH:MM:SS.fff`; out
/// of a day's range, the number as written.
fn time(raw: i64, unit: i64, format: &str) -> Json {
    let nanos = raw.checked_mul(unit).unwrap_or(-1);
    let (secs, nanos) = (nanos.div_euclid(1_000_000_000), nanos.rem_euclid(1_000_000_000));
    let time = u32::try_from(secs).ok().zip(u32::try_from(nanos).ok());
    let time = time.and_then(|(s, n)| NaiveTime::from_num_seconds_from_midnight_opt(s, n));
    time.map_or(raw.into(), |t| t.format(format).to_string().into())
}

/// An instant as RFC 3339 text in UTC; out of chrono's range, the number as written.
fn instant(at: Option<DateTime<chrono::Utc>>, raw: i64, precision: SecondsFormat) -> Json {
    at.map_or(raw.into(), |t| t.to_rfc3339_opts(precision, true).into())
}

/// A local timestamp (no zone) as RFC 3339 text without an offset.
fn local(at: Option<DateTime<chrono::Utc>>, raw: i64, fraction: &str) -> Json {
    at.map_or(raw.into(), |t| t.naive_utc().format(&format!("%Y-%m-%dT%H:%M:%S{fraction}")).to_string().into())
}

#[cfg(test)]
#[path = "avro_tests.rs"]
mod tests;

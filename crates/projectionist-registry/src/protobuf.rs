//! Protobuf: the registry's file (.proto text, or a base64 `FileDescriptorProto` as some
//! serializers register it) compiled with its imports, and a message chosen by its indexes.

use std::collections::HashMap;

use base64::Engine as _;
use prost::Message as _;
use prost_reflect::{DynamicMessage, FileDescriptor, MessageDescriptor, SerializeOptions};
use protox::file::{ChainFileResolver, File, FileResolver, GoogleFileResolver};

/// How a message becomes JSON: field names as in the .proto, every field present (defaults
/// too, so a serde type without `#[serde(default)]` reads it), 64-bit integers as numbers,
/// enums by name, bytes in base64.
const JSON: SerializeOptions =
    SerializeOptions::new().use_proto_field_name(true).skip_default_fields(false).stringify_64_bit_integers(false);

/// A compiled .proto file.
#[derive(Debug)]
pub(crate) struct ProtoSchema {
    file: FileDescriptor,
}

impl ProtoSchema {
    /// Compiles `text` (the main file) with `references`: each import's name and text.
    pub fn compile(text: &str, references: &[(String, String)]) -> Result<Self, String> {
        const MAIN: &str = "projectionist-registry-schema.proto";
        let mut files = Files::default();
        for (name, text) in references {
            files.0.insert(name.clone(), file(name, text)?);
        }
        files.0.insert(MAIN.to_owned(), file(MAIN, text)?);
        let mut resolver = ChainFileResolver::new();
        resolver.add(files);
        resolver.add(GoogleFileResolver::new());
        let mut compiler = protox::Compiler::with_file_resolver(resolver);
        compiler.open_file(MAIN).map_err(|e| e.to_string())?;
        let pool = compiler.descriptor_pool();
        let file = pool.get_file_by_name(MAIN).ok_or("the compiled pool lacks the main file")?;
        Ok(Self { file })
    }

    /// The message after the header (its indexes, then its bytes) as JSON.
    #[cfg(test)]
    pub fn decode(&self, payload: &[u8]) -> Result<serde_json::Value, String> {
        self.decode_into(payload, serde_json::value::Serializer)
    }

    /// [`ProtoSchema::decode`] into any serde serializer (JSON text, without a `Value` between).
    pub fn decode_into<S: serde::Serializer>(&self, payload: &[u8], into: S) -> Result<S::Ok, String> {
        let (indexes, bytes) = crate::wire::message_indexes(payload)?;
        let descriptor = self.message(&indexes)?;
        let name = descriptor.full_name().to_owned();
        let message = DynamicMessage::decode(descriptor, bytes).map_err(|e| format!("message {name}: {e}"))?;
        message.serialize_with_options(into, &JSON).map_err(|e| e.to_string())
    }

    /// The message the indexes name: the first into the file's messages, each next one into
    /// the previous one's nested messages.
    fn message(&self, indexes: &[usize]) -> Result<MessageDescriptor, String> {
        let names_none = || format!("the message indexes {indexes:?} name no message in the schema");
        let (first, nested) = indexes.split_first().ok_or_else(names_none)?;
        let mut message = self.file.messages().nth(*first).ok_or_else(names_none)?;
        for index in nested {
            let child = message.child_messages().nth(*index);
            message = child.ok_or_else(names_none)?;
        }
        Ok(message)
    }
}

/// A file from the registry's text: base64 of a `FileDescriptorProto`, or .proto source.
fn file(name: &str, text: &str) -> Result<File, String> {
    let descriptor = base64::engine::general_purpose::STANDARD
        .decode(text.trim())
        .ok()
        .and_then(|bytes| prost_types::FileDescriptorProto::decode(bytes.as_slice()).ok());
    match descriptor {
        Some(mut descriptor) => {
            descriptor.name = Some(name.to_owned());
            Ok(File::from_file_descriptor_proto(descriptor))
        }
        None => File::from_source(name, text).map_err(|e| e.to_string()),
    }
}

/// The registry's files, by the names imports use.
#[derive(Default)]
struct Files(HashMap<String, File>);

impl FileResolver for Files {
    fn open_file(&self, name: &str) -> Result<File, protox::Error> {
        self.0.get(name).cloned().ok_or_else(|| protox::Error::file_not_found(name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHOP: &str = r#"syntax = "proto3";
package shop;
import "google/protobuf/timestamp.proto";
import "money.proto";
message Order {
  string order_id = 1;
  int64 quantity = 2;
  message Line { string sku = 1; money.Money price = 2; }
  repeated Line lines = 3;
  google.protobuf.Timestamp at = 4;
  Status status = 5;
}
message Other { bool flag = 1; }
enum Status { NEW = 0; PAID = 1; }
"#;
    const MONEY: &str = "syntax = \"proto3\";\npackage money;\nmessage Money { int64 cents = 1; }\n";

    fn shop() -> ProtoSchema {
        ProtoSchema::compile(SHOP, &[("money.proto".into(), MONEY.into())]).unwrap()
    }

    #[test]
    fn the_first_message_with_defaults_and_proto_names() {
        // indexes [0]; order_id = "o1", quantity = 3
        let json = shop().decode(&[0, 0x0a, 2, b'o', b'1', 0x10, 3]).unwrap();
        assert_eq!(json["order_id"], "o1");
        assert_eq!(json["quantity"], 3);
        assert_eq!(json["status"], "NEW");
        assert_eq!(json["lines"], serde_json::json!([]));
    }

    #[test]
    fn indexes_pick_a_nested_message() {
        // indexes [0, 0] = Order.Line (count 2 → 4); sku = "a"
        assert_eq!(shop().decode(&[4, 0, 0, 0x0a, 1, b'a']).unwrap(), serde_json::json!({"sku": "a"}));
        // [1] = Other
        assert_eq!(shop().decode(&[2, 2, 0x08, 1]).unwrap(), serde_json::json!({"flag": true}));
    }

    #[test]
    fn indexes_that_name_no_message() {
        let error = shop().decode(&[2, 8, 0]).unwrap_err();
        assert!(error.contains("[4] name no message"), "{error}");
        assert!(shop().decode(&[4, 0, 6]).unwrap_err().contains("[0, 3]"));
    }

    #[test]
    fn a_broken_message_names_where() {
        // order_id: length 5 with 1 byte
        let error = shop().decode(&[0, 0x0a, 5, b'o']).unwrap_err();
        assert!(error.starts_with("message shop.Order: failed to decode"), "{error}");
    }

    #[test]
    fn a_base64_descriptor_compiles_too() {
        let descriptor = prost_types::FileDescriptorProto {
            name: Some("x.proto".into()),
            syntax: Some("proto3".into()),
            message_type: vec![prost_types::DescriptorProto { name: Some("M".into()), ..Default::default() }],
            ..Default::default()
        };
        let text = base64::engine::general_purpose::STANDARD.encode(descriptor.encode_to_vec());
        assert_eq!(ProtoSchema::compile(&text, &[]).unwrap().decode(&[0]).unwrap(), serde_json::json!({}));
    }

    #[test]
    fn a_missing_import_is_an_error() {
        assert!(ProtoSchema::compile(SHOP, &[]).unwrap_err().contains("money.proto"));
    }
}

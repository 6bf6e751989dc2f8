//! The Pub/Sub schemas in `deploy/terraform/schemas/` (self-contained, as Pub/Sub requires)
//! stay wire-compatible with the envelopes the services encode: the same messages, field
//! numbers, types, presence and oneofs, with the schema's own Timestamp shaped like
//! google.protobuf.Timestamp. Real Pub/Sub then rejects a malformed message at publish; the
//! emulator does not implement protobuf schemas (docs/emulator.md), so this is what can be checked.
//! The envelopes are this crate's (`proto/`) and those services keep beside their code (the
//! search service's `services/search/proto/`); every schema file has its envelope here.

use prost_types::field_descriptor_proto::Type;
use prost_types::{DescriptorProto, EnumDescriptorProto, FileDescriptorSet};
use std::collections::HashMap;
use std::path::Path;

struct Types<'a> {
    messages: HashMap<String, &'a DescriptorProto>,
    enums: HashMap<String, &'a EnumDescriptorProto>,
}

fn index<'a>(set: &'a FileDescriptorSet) -> Types<'a> {
    fn walk<'a>(prefix: &str, message: &'a DescriptorProto, types: &mut Types<'a>) {
        let name = format!("{prefix}.{}", message.name());
        for nested in &message.nested_type {
            walk(&name, nested, types);
        }
        for e in &message.enum_type {
            types.enums.insert(format!("{name}.{}", e.name()), e);
        }
        types.messages.insert(name, message);
    }
    let mut types = Types {
        messages: HashMap::new(),
        enums: HashMap::new(),
    };
    for file in &set.file {
        let prefix = format!(".{}", file.package());
        for message in &file.message_type {
            walk(&prefix, message, &mut types);
        }
        for e in &file.enum_type {
            types.enums.insert(format!("{prefix}.{}", e.name()), e);
        }
    }
    types
}

/// A message's wire shape, independent of names of types and packages.
fn shape(types: &Types<'_>, message: &DescriptorProto) -> String {
    let mut fields: Vec<_> = message.field.iter().collect();
    fields.sort_by_key(|f| f.number());
    let parts: Vec<String> = fields
        .iter()
        .map(|f| {
            let kind = match f.r#type() {
                Type::Message => {
                    let inner = types.messages[f.type_name()];
                    format!("{{{}}}", shape(types, inner))
                }
                Type::Enum => {
                    let e = types.enums[f.type_name()];
                    let values: Vec<String> = e
                        .value
                        .iter()
                        .map(|v| format!("{}={}", v.name(), v.number()))
                        .collect();
                    format!("enum[{}]", values.join(","))
                }
                other => format!("{other:?}"),
            };
            let presence = if f.proto3_optional() { "?" } else { "" };
            let oneof = match f.oneof_index {
                Some(i) if !f.proto3_optional() => {
                    format!("|{}", message.oneof_decl[i as usize].name())
                }
                _ => String::new(),
            };
            format!("{} {}:{kind}{presence}{oneof}", f.number(), f.name())
        })
        .collect();
    parts.join(" ")
}

fn event_shape(set: &FileDescriptorSet, event: &str) -> String {
    let types = index(set);
    let message = types
        .messages
        .get(event)
        .unwrap_or_else(|| panic!("{event} not found"));
    shape(&types, message)
}

fn compile(file: &str, include: &Path) -> FileDescriptorSet {
    protox::compile([file], [include]).unwrap_or_else(|e| panic!("{file}: {e}"))
}

#[test]
fn each_pubsub_schema_matches_its_envelope_on_the_wire() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let protos = crate_dir.join("proto");
    let search_protos = crate_dir.join("../../services/search/proto");
    let schemas = crate_dir.join("../../deploy/terraform/schemas");
    let topics = [
        (
            "catalog.video.events",
            &protos,
            "catalog/v1/video_events.proto",
            "catalog.v1",
        ),
        (
            "engagement.video.events",
            &protos,
            "engagement/v1/video_events.proto",
            "engagement.v1",
        ),
        (
            "search.video.events",
            &search_protos,
            "search/v1/document_events.proto",
            "search.v1",
        ),
    ];
    // A schema file without an envelope here would go unchecked.
    let mut files: Vec<String> = std::fs::read_dir(&schemas)
        .expect("deploy/terraform/schemas")
        .map(|entry| entry.expect("schema dir entry").file_name())
        .map(|name| name.to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".proto"))
        .collect();
    files.sort();
    let mut checked: Vec<String> = topics.iter().map(|t| format!("{}.proto", t.0)).collect();
    checked.sort();
    assert_eq!(
        files, checked,
        "schema files and the envelopes checked here"
    );
    for (topic, include, proto, package) in topics {
        let envelope = event_shape(&compile(proto, include), &format!(".{package}.Event"));
        let schema_file = format!("{topic}.proto");
        let schema_set = compile(&schema_file, &schemas);
        let schema = &schema_set.file[0];
        assert!(
            schema.dependency.is_empty(),
            "{schema_file} imports {:?}",
            schema.dependency
        );
        assert_eq!(
            schema.message_type.len(),
            1,
            "{schema_file}: one top-level message"
        );
        let from_schema = event_shape(&schema_set, &format!(".{package}.pubsub.Event"));
        assert_eq!(from_schema, envelope, "{schema_file} drifted from {proto}");
        assert!(
            envelope.contains("Timestamp") || envelope.contains("seconds"),
            "{envelope}"
        );
    }
}

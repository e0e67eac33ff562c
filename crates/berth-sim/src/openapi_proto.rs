//! `/openapi/v2` in the encoding kubectl asks for first
//! (`application/com.github.proto-openapi.spec.v2@v1.0+protobuf`): gnostic's `openapi.v2`
//! messages, of which the sim fills the document's info and definitions. Field numbers are
//! gnostic's `OpenAPIv2.proto`; values that are JSON in the document (defaults, enums,
//! examples, vendor extensions) travel as YAML text, which JSON is.

use prost::Message;
use serde_json::Value;

/// What kubectl sends in `Accept` for the protobuf document.
pub const ACCEPT: &str = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf";
/// What the real server answers it with (`@` is not allowed in a media type, so it is `.`).
pub const CONTENT_TYPE: &str = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf";

#[derive(Clone, PartialEq, Message)]
pub struct Document {
    #[prost(string, tag = "1")]
    pub swagger: String,
    #[prost(message, optional, tag = "2")]
    pub info: Option<Info>,
    #[prost(message, optional, tag = "8")]
    pub paths: Option<Paths>,
    #[prost(message, optional, tag = "9")]
    pub definitions: Option<Definitions>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Info {
    #[prost(string, tag = "1")]
    pub title: String,
    #[prost(string, tag = "2")]
    pub version: String,
}

#[derive(Clone, PartialEq, Message)]
pub struct Paths {
    #[prost(message, repeated, tag = "1")]
    pub vendor_extension: Vec<NamedAny>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Definitions {
    #[prost(message, repeated, tag = "1")]
    pub additional_properties: Vec<NamedSchema>,
}

#[derive(Clone, PartialEq, Message)]
pub struct NamedSchema {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(message, optional, tag = "2")]
    pub value: Option<Schema>,
}

#[derive(Clone, PartialEq, Message)]
pub struct NamedAny {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(message, optional, tag = "2")]
    pub value: Option<Any>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Any {
    #[prost(string, tag = "2")]
    pub yaml: String,
}

#[derive(Clone, PartialEq, Message)]
pub struct TypeItem {
    #[prost(string, repeated, tag = "1")]
    pub value: Vec<String>,
}

#[derive(Clone, PartialEq, Message)]
pub struct ItemsItem {
    #[prost(message, repeated, tag = "1")]
    pub schema: Vec<Schema>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Properties {
    #[prost(message, repeated, tag = "1")]
    pub additional_properties: Vec<NamedSchema>,
}

#[derive(Clone, PartialEq, Message)]
pub struct AdditionalPropertiesItem {
    #[prost(oneof = "AdditionalProperties", tags = "1, 2")]
    pub oneof: Option<AdditionalProperties>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
pub enum AdditionalProperties {
    #[prost(message, tag = "1")]
    Schema(Box<Schema>),
    #[prost(bool, tag = "2")]
    Boolean(bool),
}

#[derive(Clone, PartialEq, Message)]
pub struct Schema {
    #[prost(string, tag = "1")]
    pub xref: String,
    #[prost(string, tag = "2")]
    pub format: String,
    #[prost(string, tag = "3")]
    pub title: String,
    #[prost(string, tag = "4")]
    pub description: String,
    #[prost(message, optional, tag = "5")]
    pub default: Option<Any>,
    #[prost(double, tag = "6")]
    pub multiple_of: f64,
    #[prost(double, tag = "7")]
    pub maximum: f64,
    #[prost(bool, tag = "8")]
    pub exclusive_maximum: bool,
    #[prost(double, tag = "9")]
    pub minimum: f64,
    #[prost(bool, tag = "10")]
    pub exclusive_minimum: bool,
    #[prost(int64, tag = "11")]
    pub max_length: i64,
    #[prost(int64, tag = "12")]
    pub min_length: i64,
    #[prost(string, tag = "13")]
    pub pattern: String,
    #[prost(int64, tag = "14")]
    pub max_items: i64,
    #[prost(int64, tag = "15")]
    pub min_items: i64,
    #[prost(bool, tag = "16")]
    pub unique_items: bool,
    #[prost(int64, tag = "17")]
    pub max_properties: i64,
    #[prost(int64, tag = "18")]
    pub min_properties: i64,
    #[prost(string, repeated, tag = "19")]
    pub required: Vec<String>,
    #[prost(message, repeated, tag = "20")]
    pub r#enum: Vec<Any>,
    #[prost(message, optional, boxed, tag = "21")]
    pub additional_properties: Option<Box<AdditionalPropertiesItem>>,
    #[prost(message, optional, tag = "22")]
    pub r#type: Option<TypeItem>,
    #[prost(message, optional, tag = "23")]
    pub items: Option<ItemsItem>,
    #[prost(message, repeated, tag = "24")]
    pub all_of: Vec<Schema>,
    #[prost(message, optional, tag = "25")]
    pub properties: Option<Properties>,
    #[prost(string, tag = "26")]
    pub discriminator: String,
    #[prost(bool, tag = "27")]
    pub read_only: bool,
    #[prost(message, optional, tag = "30")]
    pub example: Option<Any>,
    #[prost(message, repeated, tag = "31")]
    pub vendor_extension: Vec<NamedAny>,
}

fn any(value: &Value) -> Any {
    Any {
        yaml: value.to_string(),
    }
}

fn text(object: &serde_json::Map<String, Value>, key: &str) -> String {
    object
        .get(key)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}

fn number(object: &serde_json::Map<String, Value>, key: &str) -> f64 {
    object.get(key).and_then(Value::as_f64).unwrap_or_default()
}

fn count(object: &serde_json::Map<String, Value>, key: &str) -> i64 {
    object.get(key).and_then(Value::as_i64).unwrap_or_default()
}

fn flag(object: &serde_json::Map<String, Value>, key: &str) -> bool {
    object.get(key).and_then(Value::as_bool).unwrap_or_default()
}

fn named(map: &serde_json::Map<String, Value>) -> Vec<NamedSchema> {
    map.iter()
        .map(|(name, value)| NamedSchema {
            name: name.clone(),
            value: Some(schema(value)),
        })
        .collect()
}

/// A JSON schema as gnostic's v2 `Schema`: what v2 has no field for (`oneOf`, `anyOf`, `not`,
/// `nullable`) is left out, as the real server's v2 document leaves it out.
pub fn schema(value: &Value) -> Schema {
    let Some(o) = value.as_object() else {
        return Schema::default();
    };
    let types: Vec<String> = match o.get("type") {
        Some(Value::String(t)) => vec![t.clone()],
        Some(Value::Array(list)) => list
            .iter()
            .filter_map(Value::as_str)
            .filter(|t| *t != "null")
            .map(str::to_owned)
            .take(1)
            .collect(),
        _ => vec![],
    };
    Schema {
        xref: text(o, "$ref"),
        format: text(o, "format"),
        title: text(o, "title"),
        description: text(o, "description"),
        default: o.get("default").map(any),
        multiple_of: number(o, "multipleOf"),
        maximum: number(o, "maximum"),
        exclusive_maximum: flag(o, "exclusiveMaximum"),
        minimum: number(o, "minimum"),
        exclusive_minimum: flag(o, "exclusiveMinimum"),
        max_length: count(o, "maxLength"),
        min_length: count(o, "minLength"),
        pattern: text(o, "pattern"),
        max_items: count(o, "maxItems"),
        min_items: count(o, "minItems"),
        unique_items: flag(o, "uniqueItems"),
        max_properties: count(o, "maxProperties"),
        min_properties: count(o, "minProperties"),
        required: o
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect(),
        r#enum: o
            .get("enum")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .map(any)
            .collect(),
        additional_properties: match o.get("additionalProperties") {
            Some(Value::Bool(b)) => Some(Box::new(AdditionalPropertiesItem {
                oneof: Some(AdditionalProperties::Boolean(*b)),
            })),
            Some(v @ Value::Object(_)) => Some(Box::new(AdditionalPropertiesItem {
                oneof: Some(AdditionalProperties::Schema(Box::new(schema(v)))),
            })),
            _ => None,
        },
        r#type: (!types.is_empty()).then_some(TypeItem { value: types }),
        items: match o.get("items") {
            Some(Value::Array(list)) => Some(ItemsItem {
                schema: list.iter().map(schema).collect(),
            }),
            Some(v @ Value::Object(_)) => Some(ItemsItem {
                schema: vec![schema(v)],
            }),
            _ => None,
        },
        all_of: o
            .get("allOf")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .map(schema)
            .collect(),
        properties: o
            .get("properties")
            .and_then(Value::as_object)
            .map(|p| Properties {
                additional_properties: named(p),
            }),
        discriminator: text(o, "discriminator"),
        read_only: flag(o, "readOnly"),
        example: o.get("example").map(any),
        vendor_extension: o
            .iter()
            .filter(|(k, _)| k.starts_with("x-"))
            .map(|(k, v)| NamedAny {
                name: k.clone(),
                value: Some(any(v)),
            })
            .collect(),
    }
}

/// The Swagger 2.0 JSON document, encoded.
pub fn encode(document: &Value) -> Vec<u8> {
    Document {
        swagger: text(
            document.as_object().unwrap_or(&Default::default()),
            "swagger",
        ),
        info: Some(Info {
            title: document["info"]["title"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            version: document["info"]["version"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        }),
        paths: Some(Paths::default()),
        definitions: document["definitions"].as_object().map(|d| Definitions {
            additional_properties: named(d),
        }),
    }
    .encode_to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_schema_keeps_what_v2_can_say_and_extensions_travel_as_yaml() {
        let encoded = schema(&json!({
            "type": "object", "description": "d", "required": ["a"],
            "properties": {"a": {"type": "array", "items": {"$ref": "#/definitions/X"}}},
            "additionalProperties": false, "oneOf": [{}],
            "x-kubernetes-group-version-kind": [{"group": "", "version": "v1", "kind": "Pod"}]
        }));
        let decoded = Schema::decode(encoded.encode_to_vec().as_slice()).unwrap();
        assert_eq!(decoded.r#type.unwrap().value, ["object"]);
        assert_eq!(decoded.required, ["a"]);
        let a = &decoded.properties.unwrap().additional_properties[0];
        let items = a.value.as_ref().unwrap().items.as_ref().unwrap();
        assert_eq!(items.schema[0].xref, "#/definitions/X");
        assert_eq!(
            decoded.additional_properties.unwrap().oneof,
            Some(AdditionalProperties::Boolean(false))
        );
        assert_eq!(
            decoded.vendor_extension[0].name,
            "x-kubernetes-group-version-kind"
        );
        let yaml = &decoded.vendor_extension[0].value.as_ref().unwrap().yaml;
        assert_eq!(
            serde_json::from_str::<Value>(yaml).unwrap(),
            json!([{"group": "", "version": "v1", "kind": "Pod"}])
        );
    }
}

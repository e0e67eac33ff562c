//! JSON as the real API server writes it: in every object that has its type (`kind` and
//! `apiVersion`), those two come first, `kind` before `apiVersion` as in Go's TypeMeta; the
//! other keys follow in their order. Watch events are `{"type":...,"object":...}`.

use serde::ser::{Serialize, SerializeMap, SerializeSeq, Serializer};
use serde_json::Value;

const TYPE_META: [&str; 2] = ["kind", "apiVersion"];

/// A value that serializes in the real server's key order.
pub struct Ordered<'a>(pub &'a Value);

impl Serialize for Ordered<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            Value::Object(map) => {
                let typed = TYPE_META.iter().all(|k| map.contains_key(*k));
                let mut out = serializer.serialize_map(Some(map.len()))?;
                if typed {
                    for key in TYPE_META {
                        out.serialize_entry(key, &Ordered(&map[key]))?;
                    }
                }
                for (key, value) in map {
                    if !(typed && TYPE_META.contains(&key.as_str())) {
                        out.serialize_entry(key, &Ordered(value))?;
                    }
                }
                out.end()
            }
            Value::Array(items) => {
                let mut out = serializer.serialize_seq(Some(items.len()))?;
                for item in items {
                    out.serialize_element(&Ordered(item))?;
                }
                out.end()
            }
            other => other.serialize(serializer),
        }
    }
}

/// The value as the real server writes it.
pub fn to_string(value: &Value) -> String {
    serde_json::to_string(&Ordered(value)).unwrap_or_default()
}

/// One watch event line's JSON (without its newline).
pub fn watch_event(kind: &str, object: &Value) -> String {
    format!(
        "{{\"type\":{},\"object\":{}}}",
        serde_json::to_string(kind).unwrap_or_default(),
        to_string(object)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn kind_and_api_version_lead_every_typed_object() {
        let list = json!({"apiVersion": "v1", "items": [{"apiVersion": "v1", "data": {"apiVersion": "x"}, "kind": "ConfigMap"}], "kind": "ConfigMapList", "metadata": {}});
        assert_eq!(
            to_string(&list),
            r#"{"kind":"ConfigMapList","apiVersion":"v1","items":[{"kind":"ConfigMap","apiVersion":"v1","data":{"apiVersion":"x"}}],"metadata":{}}"#
        );
        assert_eq!(
            watch_event("ADDED", &json!({"apiVersion": "v1", "kind": "Pod"})),
            r#"{"type":"ADDED","object":{"kind":"Pod","apiVersion":"v1"}}"#
        );
    }
}

//! Helpers on objects' metadata and the values the API server fills in (times, UIDs, name
//! suffixes), shared by the API server's verbs and the sim's controllers.

use std::collections::BTreeMap;

use jiff::Timestamp;
use rand::Rng;
use serde_json::Value;

/// Sets `object[key]` to `value`, or removes the key when there is none (a field a write
/// carries over from another version of the object, present or not).
pub fn carry(object: &mut Value, key: &str, value: Option<&Value>) {
    match value {
        Some(value) => object[key] = value.clone(),
        None => {
            if let Some(map) = object.as_object_mut() {
                map.remove(key);
            }
        }
    }
}

/// An RFC 3339 timestamp with second precision, as metadata timestamps are written.
/// Now, truncated to the second as the real server's metav1.Time stores it.
pub fn now_rfc3339() -> String {
    let now = Timestamp::now();
    Timestamp::from_second(now.as_second())
        .unwrap_or(now)
        .to_string()
}

/// A random version-4 UUID.
pub fn new_uid() -> String {
    let mut bytes: [u8; 16] = rand::rng().random();
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

pub(crate) fn random_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut rng = rand::rng();
    (0..5)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect()
}

/// A string field of an object's metadata.
pub fn meta_str<'a>(object: &'a Value, field: &str) -> Option<&'a str> {
    object["metadata"][field].as_str()
}

/// The finalizers of an object.
pub fn finalizers(object: &Value) -> Vec<String> {
    object["metadata"]["finalizers"]
        .as_array()
        .map(|f| {
            f.iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// Labels of an object as a map.
pub fn labels_of(object: &Value) -> BTreeMap<String, String> {
    object["metadata"]["labels"]
        .as_object()
        .map(|l| {
            l.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                .collect()
        })
        .unwrap_or_default()
}

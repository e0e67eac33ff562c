//! core/v1 Events and events.k8s.io/v1 Events are two views of the same stored objects, as in
//! Kubernetes. Objects are stored in the core/v1 form; these functions convert.

use serde_json::{Map, Value};

/// core/v1 field -> events.k8s.io/v1 field, for fields that only change name.
const RENAMES: &[(&str, &str)] = &[
    ("involvedObject", "regarding"),
    ("message", "note"),
    ("source", "deprecatedSource"),
    ("firstTimestamp", "deprecatedFirstTimestamp"),
    ("lastTimestamp", "deprecatedLastTimestamp"),
    ("count", "deprecatedCount"),
    ("reportingComponent", "reportingController"),
];

fn rename(object: &Value, api_version: &str, forward: bool) -> Value {
    let Value::Object(map) = object else {
        return object.clone();
    };
    let mut out = Map::new();
    for (key, value) in map {
        let renamed = RENAMES
            .iter()
            .find(|(core, v1)| if forward { core == key } else { v1 == key })
            .map(|(core, v1)| if forward { *v1 } else { *core })
            .unwrap_or(key.as_str());
        out.insert(renamed.to_owned(), value.clone());
    }
    out.insert(
        "apiVersion".to_owned(),
        Value::String(api_version.to_owned()),
    );
    out.insert("kind".to_owned(), Value::String("Event".to_owned()));
    Value::Object(out)
}

/// The timestamps of a stored Event as the real server keeps them: `eventTime` and
/// `series.lastObservedTime` (MicroTime) to the microsecond, `firstTimestamp` and
/// `lastTimestamp` (Time) to the second, all in UTC; what is not a time is the decoder's 400.
pub fn normalize_times(event: &mut Value) -> Result<(), String> {
    fn normalize(object: &mut Value, key: &str, micro: bool) -> Result<(), String> {
        let Some(value) = object.get_mut(key) else {
            return Ok(());
        };
        let Some(text) = value.as_str() else {
            return Ok(());
        };
        let time: jiff::Timestamp = text.parse().map_err(|_| {
            format!("parsing time \"{text}\" as \"2006-01-02T15:04:05Z07:00\": cannot parse")
        })?;
        let format = if micro {
            "%Y-%m-%dT%H:%M:%S%.6fZ"
        } else {
            "%Y-%m-%dT%H:%M:%SZ"
        };
        *value = Value::String(time.strftime(format).to_string());
        Ok(())
    }
    normalize(event, "eventTime", true)?;
    normalize(event, "firstTimestamp", false)?;
    normalize(event, "lastTimestamp", false)?;
    if let Some(series) = event.get_mut("series") {
        normalize(series, "lastObservedTime", true)?;
    }
    Ok(())
}

/// The events.k8s.io/v1 view of a stored core/v1 Event.
pub fn to_v1(core: &Value) -> Value {
    rename(core, "events.k8s.io/v1", true)
}

/// The core/v1 form of an events.k8s.io/v1 Event.
pub fn from_v1(v1: &Value) -> Value {
    rename(v1, "v1", false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn times_are_kept_as_the_real_server_keeps_them() {
        let mut event = json!({"eventTime": "2026-12-02T14:15:16.123456789+01:00",
            "firstTimestamp": "2026-12-02T14:15:16.9Z", "series": {"lastObservedTime": "2026-12-02T14:15:16Z"}});
        normalize_times(&mut event).unwrap();
        assert_eq!(event["eventTime"], "2026-12-02T13:15:16.123456Z");
        assert_eq!(event["firstTimestamp"], "2026-12-02T14:15:16Z");
        assert_eq!(
            event["series"]["lastObservedTime"],
            "2026-12-02T14:15:16.000000Z"
        );
        assert!(event.get("lastTimestamp").is_none());
        let mut bad = json!({"eventTime": "yesterday"});
        assert!(
            normalize_times(&mut bad)
                .unwrap_err()
                .starts_with("parsing time \"yesterday\"")
        );
    }

    #[test]
    fn views_round_trip() {
        let core = json!({
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": "e", "namespace": "default"},
            "involvedObject": {"kind": "Pod", "name": "p", "uid": "u"},
            "reason": "FailedMount", "message": "secret \"s\" not found", "type": "Warning",
            "count": 3, "reportingComponent": "kubelet", "source": {"component": "kubelet"},
            "series": {"count": 3}
        });
        let v1 = to_v1(&core);
        assert_eq!(v1["apiVersion"], "events.k8s.io/v1");
        assert_eq!(v1["regarding"]["uid"], "u");
        assert_eq!(v1["note"], "secret \"s\" not found");
        assert_eq!(v1["deprecatedCount"], 3);
        assert_eq!(v1["reportingController"], "kubelet");
        assert_eq!(v1["series"]["count"], 3);
        assert_eq!(from_v1(&v1), core);
    }
}

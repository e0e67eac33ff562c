//! Durations in the spec are Kubernetes-style strings (`30s`, `10m`, `1h30m`, `500ms`); this
//! module is the one place they become `std::time::Duration`.

use std::{borrow::Cow, fmt, time::Duration};

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// The schema pattern for duration strings; [`parse_duration`] accepts exactly this language.
pub const DURATION_PATTERN: &str = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$";

/// A duration as written in a spec, e.g. `"10m"`. Kept as the user wrote it; the API server
/// checks it against [`DURATION_PATTERN`] and [`DurationString::to_duration`] reads it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct DurationString(pub String);

impl DurationString {
    /// The duration this string means.
    pub fn to_duration(&self) -> Result<Duration> {
        parse_duration(&self.0)
    }
}

impl From<&str> for DurationString {
    fn from(s: &str) -> Self {
        DurationString(s.to_owned())
    }
}

impl fmt::Display for DurationString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl JsonSchema for DurationString {
    fn schema_name() -> Cow<'static, str> {
        "DurationString".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            "pattern": DURATION_PATTERN,
            "maxLength": 32,
        })
    }
}

/// Parses a Kubernetes-style duration: one or more `<number><unit>` terms, units `ms`, `s`,
/// `m`, `h`, numbers with an optional fraction (`1.5h`). Terms add up (`1h30m`).
pub fn parse_duration(input: &str) -> Result<Duration> {
    let invalid = |problem: &str| Error::InvalidDuration {
        input: input.to_owned(),
        problem: problem.to_owned(),
    };
    if input.is_empty() {
        return Err(invalid(
            "it is empty; write a number and a unit, e.g. 30s or 10m",
        ));
    }
    let mut rest = input;
    let mut total = Duration::ZERO;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, after) = rest.split_at(number_len);
        if number.is_empty() {
            return Err(invalid("expected a number before each unit"));
        }
        let unit_len = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, next) = after.split_at(unit_len);
        let unit_seconds = match unit {
            "ms" => 0.001,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            "" => return Err(invalid("a number has no unit; use ms, s, m or h")),
            _ => {
                return Err(invalid(&format!(
                    "unknown unit {unit:?}; use ms, s, m or h"
                )));
            }
        };
        let valid_number = {
            let mut parts = number.split('.');
            let whole = parts.next().unwrap_or_default();
            let fraction = parts.next();
            !whole.is_empty() && parts.next().is_none() && fraction.is_none_or(|f| !f.is_empty())
        };
        if !valid_number {
            return Err(invalid(&format!("{number:?} is not a number")));
        }
        let value: f64 = number
            .parse()
            .map_err(|_| invalid(&format!("{number:?} is not a number")))?;
        let term = Duration::try_from_secs_f64(value * unit_seconds)
            .map_err(|_| invalid("it is too large"))?;
        total = total
            .checked_add(term)
            .ok_or_else(|| invalid("it is too large"))?;
        rest = next;
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The API server refuses a duration the operator could not read: the CRD carries the
    /// pattern [`parse_duration`] accepts, on every duration field.
    #[test]
    fn the_crd_checks_a_duration_by_its_pattern() {
        let crd = serde_json::to_value(crate::crd::workspace_crd()).unwrap();
        let lifecycle = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
            ["properties"]["lifecycle"]["properties"];
        for field in ["idleTimeout", "startTimeout"] {
            let schema = &lifecycle[field];
            assert_eq!(schema["type"], "string", "{field}: {schema}");
            assert_eq!(schema["pattern"], DURATION_PATTERN, "{field}");
            assert_eq!(schema["maxLength"], 32, "{field}");
        }
    }

    #[test]
    fn a_duration_is_shown_as_it_was_written() {
        assert_eq!(DurationString::from("1h30m").to_string(), "1h30m");
    }

    #[test]
    fn valid_durations() {
        let rows: &[(&str, Duration)] = &[
            ("30s", Duration::from_secs(30)),
            ("10m", Duration::from_secs(600)),
            ("1h", Duration::from_secs(3600)),
            ("1h30m", Duration::from_secs(5400)),
            ("500ms", Duration::from_millis(500)),
            ("1.5h", Duration::from_secs(5400)),
            ("0s", Duration::ZERO),
            ("2m15s", Duration::from_secs(135)),
        ];
        for (input, expected) in rows {
            assert_eq!(parse_duration(input).unwrap(), *expected, "{input}");
        }
    }

    #[test]
    fn invalid_durations_say_what_is_wrong() {
        let rows: &[(&str, &str)] = &[
            (
                "",
                r#"invalid duration "": it is empty; write a number and a unit, e.g. 30s or 10m"#,
            ),
            (
                "10",
                r#"invalid duration "10": a number has no unit; use ms, s, m or h"#,
            ),
            (
                "10d",
                r#"invalid duration "10d": unknown unit "d"; use ms, s, m or h"#,
            ),
            (
                "m",
                r#"invalid duration "m": expected a number before each unit"#,
            ),
            ("1.s", r#"invalid duration "1.s": "1." is not a number"#),
            (
                "1..2s",
                r#"invalid duration "1..2s": "1..2" is not a number"#,
            ),
            (
                "-5s",
                r#"invalid duration "-5s": expected a number before each unit"#,
            ),
            (
                "10 s",
                r#"invalid duration "10 s": unknown unit " s"; use ms, s, m or h"#,
            ),
            (
                "99999999999999999999h",
                r#"invalid duration "99999999999999999999h": it is too large"#,
            ),
        ];
        for (input, message) in rows {
            let err = parse_duration(input).unwrap_err();
            assert_eq!(err.to_string(), *message, "{input}");
            assert_eq!(err.reason(), "InvalidDuration");
        }
    }

    #[test]
    fn duration_string_reads_through_the_same_parser() {
        assert_eq!(
            DurationString::from("15s").to_duration().unwrap(),
            Duration::from_secs(15)
        );
        assert!(DurationString::from("soon").to_duration().is_err());
    }

    proptest::proptest! {
        /// The parser and the schema pattern agree: the parser accepts a string if and only
        /// if it has the pattern's shape (and is not too large).
        #[test]
        fn parser_agrees_with_pattern(input in "[0-9.]{0,4}(ms|s|m|h|d|)([0-9.]{0,3}(ms|s|m|h|x|))?") {
            let pattern_accepts = matches_pattern(&input);
            let parser_accepts = parse_duration(&input).is_ok();
            proptest::prop_assert_eq!(pattern_accepts, parser_accepts, "{}", input);
        }
    }

    fn matches_pattern(input: &str) -> bool {
        regex::Regex::new(DURATION_PATTERN)
            .expect("the duration pattern is a valid regex")
            .is_match(input)
    }
}

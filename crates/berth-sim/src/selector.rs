//! Label and field selectors as the API server parses and matches them.

use std::collections::BTreeMap;

use crate::error::{ApiError, ApiResult};

/// One requirement of a label selector.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed label selector; empty matches everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LabelSelector(pub Vec<Requirement>);

impl LabelSelector {
    /// Parses `a=b,c!=d,e in (x,y),f notin (z),g,!h`.
    pub fn parse(input: &str) -> ApiResult<Self> {
        let mut requirements = vec![];
        for term in split_top_level(input) {
            let term = term.trim();
            if term.is_empty() {
                continue;
            }
            requirements.push(parse_requirement(term)?);
        }
        Ok(LabelSelector(requirements))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0.iter().all(|r| match r {
            Requirement::Equals(k, v) => labels.get(k) == Some(v),
            Requirement::NotEquals(k, v) => labels.get(k) != Some(v),
            Requirement::In(k, vs) => labels.get(k).is_some_and(|v| vs.contains(v)),
            Requirement::NotIn(k, vs) => labels.get(k).is_none_or(|v| !vs.contains(v)),
            Requirement::Exists(k) => labels.contains_key(k),
            Requirement::NotExists(k) => !labels.contains_key(k),
        })
    }
}

/// Splits on commas that are not inside parentheses.
fn split_top_level(input: &str) -> Vec<&str> {
    let mut parts = vec![];
    let mut depth = 0usize;
    let mut start = 0;
    for (i, c) in input.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(&input[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&input[start..]);
    parts
}

fn parse_error(term: &str, why: &str) -> ApiError {
    ApiError::bad_request(format!("unable to parse requirement: {why}: {term:?}"))
}

fn validate_key(key: &str, term: &str) -> ApiResult<String> {
    let key = key.trim();
    let valid = !key.is_empty()
        && key.len() <= 316
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'));
    if valid {
        Ok(key.to_owned())
    } else {
        Err(parse_error(term, "invalid label key"))
    }
}

fn validate_value(value: &str, term: &str) -> ApiResult<String> {
    let value = value.trim();
    let valid = value.len() <= 63
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if valid {
        Ok(value.to_owned())
    } else {
        Err(parse_error(term, "invalid label value"))
    }
}

fn parse_requirement(term: &str) -> ApiResult<Requirement> {
    if let Some(key) = term.strip_prefix('!') {
        return Ok(Requirement::NotExists(validate_key(key, term)?));
    }
    if let Some((key, value)) = term.split_once("!=") {
        return Ok(Requirement::NotEquals(
            validate_key(key, term)?,
            validate_value(value, term)?,
        ));
    }
    if let Some((key, value)) = term.split_once("==") {
        return Ok(Requirement::Equals(
            validate_key(key, term)?,
            validate_value(value, term)?,
        ));
    }
    if let Some((key, value)) = term.split_once('=') {
        return Ok(Requirement::Equals(
            validate_key(key, term)?,
            validate_value(value, term)?,
        ));
    }
    for (word, negate) in [(" notin ", true), (" in ", false)] {
        if let Some((key, rest)) = term.split_once(word) {
            let rest = rest.trim();
            let inner = rest
                .strip_prefix('(')
                .and_then(|r| r.strip_suffix(')'))
                .ok_or_else(|| parse_error(term, "expected a parenthesised set of values"))?;
            let values = inner
                .split(',')
                .map(|v| validate_value(v, term))
                .collect::<ApiResult<Vec<_>>>()?;
            let key = validate_key(key, term)?;
            return Ok(if negate {
                Requirement::NotIn(key, values)
            } else {
                Requirement::In(key, values)
            });
        }
    }
    Ok(Requirement::Exists(validate_key(term, term)?))
}

/// One term of a field selector.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldTerm {
    pub field: String,
    pub value: String,
    pub negated: bool,
}

/// A parsed field selector.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldSelector(pub Vec<FieldTerm>);

impl FieldSelector {
    /// Parses `a=b,c!=d` (also `==`).
    pub fn parse(input: &str) -> ApiResult<Self> {
        let mut terms = vec![];
        for term in input.split(',') {
            let term = term.trim();
            if term.is_empty() {
                continue;
            }
            let (field, value, negated) = if let Some((f, v)) = term.split_once("!=") {
                (f, v, true)
            } else if let Some((f, v)) = term.split_once("==") {
                (f, v, false)
            } else if let Some((f, v)) = term.split_once('=') {
                (f, v, false)
            } else {
                return Err(ApiError::bad_request(format!(
                    "invalid selector: '{input}'; can't understand '{term}'"
                )));
            };
            terms.push(FieldTerm {
                field: field.trim().to_owned(),
                value: value.trim().to_owned(),
                negated,
            });
        }
        Ok(FieldSelector(terms))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether `value_of(field)` satisfies every term.
    pub fn matches(&self, value_of: impl Fn(&str) -> String) -> bool {
        self.0
            .iter()
            .all(|t| (value_of(&t.field) == t.value) != t.negated)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn label_selector_operators() {
        let l = labels(&[("app", "web"), ("tier", "front")]);
        let rows: &[(&str, bool)] = &[
            ("", true),
            ("app=web", true),
            ("app==web", true),
            ("app=db", false),
            ("app!=db", true),
            ("app!=web", false),
            ("missing!=x", true),
            ("app in (web,db)", true),
            ("app in (db)", false),
            ("app notin (db)", true),
            ("app notin (web)", false),
            ("missing notin (web)", true),
            ("tier", true),
            ("missing", false),
            ("!missing", true),
            ("!app", false),
            ("app=web,tier=front", true),
            ("app in (web, db),tier=back", false),
            ("berth.dev/workspace", false),
        ];
        for (selector, expected) in rows {
            let parsed = LabelSelector::parse(selector).unwrap();
            assert_eq!(parsed.matches(&l), *expected, "{selector}");
        }
    }

    #[test]
    fn bad_label_selectors_are_400() {
        for bad in ["app in web", "a b=c", "app=$$"] {
            let err = LabelSelector::parse(bad).unwrap_err();
            assert_eq!(err.code(), 400, "{bad}");
        }
    }

    #[test]
    fn field_selector_terms() {
        let sel = FieldSelector::parse("spec.nodeName=node-1,status.phase!=Failed").unwrap();
        let value = |f: &str| match f {
            "spec.nodeName" => "node-1".to_owned(),
            "status.phase" => "Running".to_owned(),
            _ => String::new(),
        };
        assert!(sel.matches(value));
        assert!(FieldSelector::parse("nonsense").is_err());
    }
}

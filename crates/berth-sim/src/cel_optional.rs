//! CEL's optional types where `kube-cel` lacks them, by rewriting a rule into CEL it
//! evaluates: `oldSelf` of a rule with `optionalOldSelf: true` is an optional (none on create,
//! of the old value on update), as in the API server; `x.optMap(v, e)` and
//! `x.optFlatMap(v, e)` (macros of the optional library) become the conditional they stand
//! for, with `x.value()` for `v` in `e`. Strings in a rule are left as they are.

/// The spans of a rule that are code, not string literals.
fn in_code(rule: &str) -> Vec<bool> {
    let bytes = rule.as_bytes();
    let mut code = vec![true; bytes.len()];
    let mut i = 0;
    while i < bytes.len() {
        let quote = bytes[i];
        if quote == b'"' || quote == b'\'' {
            let triple = bytes.get(i..i + 3) == Some(&[quote, quote, quote][..]);
            let width = if triple { 3 } else { 1 };
            let start = i;
            i += width;
            while i < bytes.len() {
                if bytes[i] == b'\\' {
                    i += 2;
                    continue;
                }
                if bytes[i] == quote
                    && (!triple || bytes.get(i..i + 3) == Some(&[quote, quote, quote][..]))
                {
                    i += width;
                    break;
                }
                i += 1;
            }
            for c in code.iter_mut().take(i.min(bytes.len())).skip(start) {
                *c = false;
            }
            continue;
        }
        i += 1;
    }
    code
}

fn is_ident(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// Replaces the identifier `name` (whole words, in code, not a field after `.`) with `with`.
fn replace_ident(rule: &str, name: &str, with: &str) -> String {
    let code = in_code(rule);
    let bytes = rule.as_bytes();
    let mut out = String::new();
    let mut i = 0;
    while i < bytes.len() {
        let here = rule[i..].starts_with(name)
            && code[i]
            && (i == 0 || (!is_ident(bytes[i - 1]) && bytes[i - 1] != b'.'))
            && bytes.get(i + name.len()).is_none_or(|b| !is_ident(*b));
        if here {
            out.push_str(with);
            i += name.len();
        } else {
            let c = rule[i..].chars().next().unwrap_or_default();
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

/// Where the receiver of a call at `dot` (the `.` before its name) starts: identifiers,
/// field selections (`.` and `.?`), calls and indexes, back to an operator or an open bracket.
fn receiver_start(rule: &str, dot: usize) -> usize {
    let bytes = rule.as_bytes();
    let mut i = dot;
    loop {
        if i == 0 {
            return 0;
        }
        let b = bytes[i - 1];
        if is_ident(b) || b == b'.' || b == b'?' {
            i -= 1;
        } else if b == b')' || b == b']' {
            let (open, close) = if b == b')' {
                (b'(', b')')
            } else {
                (b'[', b']')
            };
            let mut depth = 0;
            while i > 0 {
                i -= 1;
                if bytes[i] == close {
                    depth += 1;
                } else if bytes[i] == open {
                    depth -= 1;
                    if depth == 0 {
                        break;
                    }
                }
            }
        } else {
            return i;
        }
    }
}

/// The end (exclusive, after the `)`) of the arguments opened at `open` (the `(`), and the
/// arguments split at top-level commas.
fn arguments(rule: &str, open: usize) -> Option<(usize, Vec<String>)> {
    let code = in_code(rule);
    let bytes = rule.as_bytes();
    let mut depth = 0;
    let mut args = vec![];
    let mut start = open + 1;
    for i in open..bytes.len() {
        if !code[i] {
            continue;
        }
        match bytes[i] {
            b'(' | b'[' | b'{' => depth += 1,
            b')' | b']' | b'}' => {
                depth -= 1;
                if depth == 0 {
                    args.push(rule[start..i].trim().to_owned());
                    return Some((i + 1, args));
                }
            }
            b',' if depth == 1 => {
                args.push(rule[start..i].trim().to_owned());
                start = i + 1;
            }
            _ => {}
        }
    }
    None
}

/// Rewrites the first `.optMap(` or `.optFlatMap(` call in code; None when there is none.
fn rewrite_one_macro(rule: &str) -> Option<String> {
    let code = in_code(rule);
    let (dot, flat) = ["optMap(", "optFlatMap("]
        .iter()
        .filter_map(|name| {
            rule.match_indices(&format!(".{name}"))
                .find(|(i, _)| code[*i])
                .map(|(i, _)| (i, *name == "optFlatMap("))
        })
        .min_by_key(|(i, _)| *i)?;
    let name_len = if flat {
        ".optFlatMap".len()
    } else {
        ".optMap".len()
    };
    let start = receiver_start(rule, dot);
    let receiver = &rule[start..dot];
    let (end, args) = arguments(rule, dot + name_len)?;
    let [variable, expression] = args.as_slice() else {
        return None;
    };
    // The macro binds `v` to the value: each `v` in `e` becomes `x.value()`.
    let mapped = format!(
        "({})",
        replace_ident(expression, variable, &format!("({receiver}).value()"))
    );
    let then = if flat {
        mapped
    } else {
        format!("optional.of({mapped})")
    };
    Some(format!(
        "{}(({receiver}).hasValue() ? {then} : optional.none()){}",
        &rule[..start],
        &rule[end..]
    ))
}

/// `rule` in CEL that `kube-cel` evaluates, with the optional types' meaning; the rule itself
/// when it needs nothing.
pub fn rewrite(rule: &str, optional_old_self: bool) -> String {
    let mut out = if optional_old_self {
        replace_ident(
            rule,
            "oldSelf",
            "(oldSelf == null ? optional.none() : optional.of(oldSelf))",
        )
    } else {
        rule.to_owned()
    };
    // Innermost first is not needed: each pass rewrites the leftmost call, whose arguments
    // may hold more.
    for _ in 0..16 {
        match rewrite_one_macro(&out) {
            Some(next) => out = next,
            None => break,
        }
    }
    out
}

/// Rewrites every rule of a CRD schema in place; returns (rewritten, original) for each rule
/// changed, so errors can name the rule as written.
pub fn rewrite_schema(schema: &mut serde_json::Value) -> Vec<(String, String)> {
    let mut changed = vec![];
    walk(schema, &mut changed);
    changed
}

fn walk(schema: &mut serde_json::Value, changed: &mut Vec<(String, String)>) {
    match schema {
        serde_json::Value::Object(map) => {
            if let Some(rules) = map
                .get_mut("x-kubernetes-validations")
                .and_then(serde_json::Value::as_array_mut)
            {
                for rule in rules.iter_mut() {
                    let Some(text) = rule["rule"].as_str().map(str::to_owned) else {
                        continue;
                    };
                    let optional = rule["optionalOldSelf"] == true;
                    let new = rewrite(&text, optional);
                    if new != text {
                        rule["rule"] = serde_json::Value::String(new.clone());
                        changed.push((new, text));
                    }
                }
            }
            for (key, value) in map.iter_mut() {
                if key != "x-kubernetes-validations" {
                    walk(value, changed);
                }
            }
        }
        serde_json::Value::Array(items) => {
            for item in items {
                walk(item, changed);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube_cel::cel::{Context, Program, Value};

    fn eval(rule: &str, old: Option<i64>, new: i64, optional: bool) -> Value {
        let program = Program::compile(&rewrite(rule, optional)).unwrap();
        let mut ctx = Context::default();
        kube_cel::KubeCelExt::register_all(&mut ctx);
        ctx.add_variable_from_value("self", new);
        match old {
            Some(old) => ctx.add_variable_from_value("oldSelf", old),
            None => ctx.add_variable_from_value("oldSelf", Value::Null),
        }
        program.execute(&ctx).unwrap()
    }

    #[test]
    fn an_optional_old_self_is_none_on_create_and_the_old_value_on_update() {
        let immutable = "oldSelf.optMap(o, o == self).orValue(true)";
        assert_eq!(eval(immutable, None, 3, true), Value::Bool(true));
        assert_eq!(eval(immutable, Some(3), 3, true), Value::Bool(true));
        assert_eq!(eval(immutable, Some(2), 3, true), Value::Bool(false));
        let has = "!oldSelf.hasValue() || oldSelf.value() <= self";
        assert_eq!(eval(has, None, 3, true), Value::Bool(true));
        assert_eq!(eval(has, Some(4), 3, true), Value::Bool(false));
        let flat =
            "oldSelf.optFlatMap(o, o > 1 ? optional.of(o) : optional.none()).orValue(0) <= self";
        assert_eq!(eval(flat, Some(5), 3, true), Value::Bool(false));
        assert_eq!(eval(flat, Some(1), 3, true), Value::Bool(true));
    }

    #[test]
    fn strings_and_fields_named_like_old_self_are_left_alone() {
        assert_eq!(
            rewrite("self.oldSelf == 'oldSelf.optMap(a, b)'", true),
            "self.oldSelf == 'oldSelf.optMap(a, b)'"
        );
    }
}

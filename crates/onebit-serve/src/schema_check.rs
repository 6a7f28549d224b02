//! Checks a JSON value against a JSON Schema (draft 2020-12 meaning, with
//! draft-07's `definitions` and array-form `items`), for the lenient
//! tool-call rule of [`crate::tools`]: a bare JSON call is taken as a call
//! only when its arguments pass here. The invariant: `check` says `Ok` only
//! when every keyword of the schema that constrains a value was checked and
//! held. A keyword it does not implement is [`Invalid::Unchecked`], never
//! passed over; annotations (`title`, `description`, `format`, ...) do not
//! constrain and are skipped, as the specification says they may be.

use serde_json::{Map, Value};

/// Why a value does not pass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Invalid {
    /// The value breaks the schema: where (a JSON pointer) and how.
    Fails(String),
    /// The schema uses a keyword (or a reference, a pattern) this checker
    /// cannot check: named, so the caller can say so.
    Unchecked(String),
}

/// Keywords that only annotate (they never make a value invalid).
const ANNOTATIONS: [&str; 15] = [
    "$schema",
    "$id",
    "$anchor",
    "$comment",
    "$defs",
    "definitions",
    "title",
    "description",
    "default",
    "examples",
    "format",
    "deprecated",
    "readOnly",
    "writeOnly",
    "contentMediaType",
];

/// Nesting bound: a schema whose `$ref`s loop (`{"$ref": "#"}` on an
/// endless value cannot exist, but a deep value can) stops here.
const MAX_DEPTH: usize = 64;

/// Checks `value` against `schema` (its `$ref`s resolved within it).
pub fn check(value: &Value, schema: &Value) -> Result<(), Invalid> {
    Checker { root: schema }.at(value, schema, "", 0)
}

struct Checker<'a> {
    root: &'a Value,
}

fn fails(path: &str, why: String) -> Invalid {
    Invalid::Fails(format!(
        "{}: {why}",
        if path.is_empty() { "/" } else { path }
    ))
}

/// JSON equality with numbers compared by value (`1` equals `1.0`).
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (x.as_i64(), y.as_i64()) {
            (Some(i), Some(j)) => i == j,
            _ => x.as_f64() == y.as_f64(),
        },
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| same(a, b))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w)))
        }
        _ => a == b,
    }
}

fn is_type(v: &Value, t: &str) -> Option<bool> {
    Some(match t {
        "null" => v.is_null(),
        "boolean" => v.is_boolean(),
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "number" => v.is_number(),
        // 2020-12: a number with no fractional part is an integer (1.0 too).
        "integer" => v.as_f64().is_some_and(|f| f.fract() == 0.0),
        _ => return None,
    })
}

fn num(schema: &Map<String, Value>, k: &str) -> Result<Option<f64>, Invalid> {
    match schema.get(k) {
        None => Ok(None),
        Some(v) => v
            .as_f64()
            .map(Some)
            .ok_or_else(|| Invalid::Unchecked(format!("`{k}` is not a number"))),
    }
}

fn count(schema: &Map<String, Value>, k: &str) -> Result<Option<usize>, Invalid> {
    match schema.get(k) {
        None => Ok(None),
        Some(v) => v
            .as_u64()
            .map(|n| Some(n as usize))
            .ok_or_else(|| Invalid::Unchecked(format!("`{k}` is not a count"))),
    }
}

impl Checker<'_> {
    /// The schema a local reference (`#`, `#/$defs/X`, any `#/..` pointer) names.
    fn resolve(&self, r: &str) -> Result<&Value, Invalid> {
        let pointer = r
            .strip_prefix('#')
            .ok_or_else(|| Invalid::Unchecked(format!("the reference {r:?} is not local")))?;
        self.root
            .pointer(pointer)
            .ok_or_else(|| Invalid::Unchecked(format!("the reference {r:?} names nothing")))
    }

    fn at(&self, v: &Value, schema: &Value, path: &str, depth: usize) -> Result<(), Invalid> {
        if depth > MAX_DEPTH {
            return Err(Invalid::Unchecked(format!(
                "{path}: nested deeper than {MAX_DEPTH}"
            )));
        }
        let s = match schema {
            Value::Bool(true) => return Ok(()),
            Value::Bool(false) => return Err(fails(path, "the schema allows nothing".into())),
            Value::Object(s) => s,
            _ => {
                return Err(Invalid::Unchecked(format!(
                    "{path}: a schema that is not an object"
                )))
            }
        };
        for (k, kv) in s {
            if ANNOTATIONS.contains(&k.as_str()) || k.starts_with("x-") {
                continue;
            }
            self.keyword(v, s, k, kv, path, depth)?;
        }
        Ok(())
    }

    fn keyword(
        &self,
        v: &Value,
        s: &Map<String, Value>,
        k: &str,
        kv: &Value,
        path: &str,
        depth: usize,
    ) -> Result<(), Invalid> {
        let unchecked = || Invalid::Unchecked(format!("{path}: the keyword `{k}` as given"));
        match k {
            "$ref" => {
                let target = self.resolve(kv.as_str().ok_or_else(unchecked)?)?;
                self.at(v, target, path, depth + 1)
            }
            "type" => {
                let types: Vec<&str> = match kv {
                    Value::String(t) => vec![t.as_str()],
                    Value::Array(a) => a.iter().filter_map(Value::as_str).collect(),
                    _ => return Err(unchecked()),
                };
                let mut ok = false;
                for t in &types {
                    ok |= is_type(v, t).ok_or_else(unchecked)?;
                }
                if ok {
                    Ok(())
                } else {
                    Err(fails(
                        path,
                        format!("{v} is not of type {}", types.join(" or ")),
                    ))
                }
            }
            "enum" => {
                let list = kv.as_array().ok_or_else(unchecked)?;
                if list.iter().any(|e| same(e, v)) {
                    Ok(())
                } else {
                    Err(fails(path, format!("{v} is not one of {kv}")))
                }
            }
            "const" => {
                if same(kv, v) {
                    Ok(())
                } else {
                    Err(fails(path, format!("{v} is not {kv}")))
                }
            }
            "allOf" | "anyOf" | "oneOf" => {
                let list = kv.as_array().ok_or_else(unchecked)?;
                let mut passed = 0;
                for sub in list {
                    match self.at(v, sub, path, depth + 1) {
                        Ok(()) => passed += 1,
                        Err(Invalid::Fails(why)) if k == "allOf" => {
                            return Err(Invalid::Fails(why))
                        }
                        Err(Invalid::Fails(_)) => {}
                        Err(u @ Invalid::Unchecked(_)) => return Err(u),
                    }
                }
                let ok = match k {
                    "allOf" => true,
                    "anyOf" => passed > 0,
                    _ => passed == 1,
                };
                if ok {
                    Ok(())
                } else {
                    Err(fails(
                        path,
                        format!("{v} matches {passed} of the `{k}` schemas"),
                    ))
                }
            }
            "not" => match self.at(v, kv, path, depth + 1) {
                Ok(()) => Err(fails(path, format!("{v} matches the `not` schema"))),
                Err(Invalid::Fails(_)) => Ok(()),
                Err(u) => Err(u),
            },
            // Numbers.
            "minimum" | "maximum" | "exclusiveMinimum" | "exclusiveMaximum" | "multipleOf" => {
                let Some(x) = v.as_f64() else { return Ok(()) };
                let b = num(s, k)?.ok_or_else(unchecked)?;
                let ok = match k {
                    "minimum" => x >= b,
                    "maximum" => x <= b,
                    "exclusiveMinimum" => x > b,
                    "exclusiveMaximum" => x < b,
                    _ => {
                        b > 0.0 && {
                            let q = x / b;
                            (q - q.round()).abs() < 1e-9
                        }
                    }
                };
                if ok {
                    Ok(())
                } else {
                    Err(fails(path, format!("{v} breaks `{k}: {kv}`")))
                }
            }
            // Strings.
            "minLength" | "maxLength" => {
                let Some(t) = v.as_str() else { return Ok(()) };
                let n = count(s, k)?.ok_or_else(unchecked)?;
                let len = t.chars().count();
                if (k == "minLength" && len >= n) || (k == "maxLength" && len <= n) {
                    Ok(())
                } else {
                    Err(fails(path, format!("{len} characters break `{k}: {n}`")))
                }
            }
            "pattern" => {
                let Some(t) = v.as_str() else { return Ok(()) };
                let re = regex::Regex::new(kv.as_str().ok_or_else(unchecked)?).map_err(|_| {
                    Invalid::Unchecked(format!(
                        "{path}: the pattern {kv} (not a regex this checker reads)"
                    ))
                })?;
                if re.is_match(t) {
                    Ok(())
                } else {
                    Err(fails(path, format!("{v} does not match the pattern {kv}")))
                }
            }
            // Arrays.
            "items" | "prefixItems" | "minItems" | "maxItems" | "uniqueItems" => {
                let Some(a) = v.as_array() else { return Ok(()) };
                self.array(a, s, k, kv, path, depth)
            }
            // Objects.
            "properties"
            | "required"
            | "additionalProperties"
            | "minProperties"
            | "maxProperties" => {
                let Some(o) = v.as_object() else {
                    return Ok(());
                };
                self.object(o, s, k, kv, path, depth)
            }
            _ => Err(Invalid::Unchecked(format!("{path}: the keyword `{k}`"))),
        }
    }

    fn array(
        &self,
        a: &[Value],
        s: &Map<String, Value>,
        k: &str,
        kv: &Value,
        path: &str,
        depth: usize,
    ) -> Result<(), Invalid> {
        let unchecked = || Invalid::Unchecked(format!("{path}: the keyword `{k}` as given"));
        let item = |i: usize| format!("{path}/{i}");
        match k {
            "prefixItems" => {
                let list = kv.as_array().ok_or_else(unchecked)?;
                for (i, (x, sub)) in a.iter().zip(list).enumerate() {
                    self.at(x, sub, &item(i), depth + 1)?;
                }
                Ok(())
            }
            "items" => {
                // Draft-07's list form is a tuple, like 2020-12's prefixItems;
                // a schema form covers the items after any prefix.
                if let Value::Array(list) = kv {
                    if s.contains_key("prefixItems") || s.contains_key("additionalItems") {
                        return Err(unchecked());
                    }
                    for (i, (x, sub)) in a.iter().zip(list).enumerate() {
                        self.at(x, sub, &item(i), depth + 1)?;
                    }
                    return Ok(());
                }
                let skip = s
                    .get("prefixItems")
                    .and_then(Value::as_array)
                    .map_or(0, Vec::len);
                for (i, x) in a.iter().enumerate().skip(skip) {
                    self.at(x, kv, &item(i), depth + 1)?;
                }
                Ok(())
            }
            "minItems" | "maxItems" => {
                let n = count(s, k)?.ok_or_else(unchecked)?;
                if (k == "minItems" && a.len() >= n) || (k == "maxItems" && a.len() <= n) {
                    Ok(())
                } else {
                    Err(fails(path, format!("{} items break `{k}: {n}`", a.len())))
                }
            }
            _ => {
                if kv != &Value::Bool(true) {
                    return Ok(());
                }
                for (i, x) in a.iter().enumerate() {
                    if a[..i].iter().any(|y| same(x, y)) {
                        return Err(fails(path, format!("item {i} repeats an earlier one")));
                    }
                }
                Ok(())
            }
        }
    }

    fn object(
        &self,
        o: &Map<String, Value>,
        s: &Map<String, Value>,
        k: &str,
        kv: &Value,
        path: &str,
        depth: usize,
    ) -> Result<(), Invalid> {
        let unchecked = || Invalid::Unchecked(format!("{path}: the keyword `{k}` as given"));
        let key = |name: &str| format!("{path}/{}", name.replace('~', "~0").replace('/', "~1"));
        match k {
            "properties" => {
                let props = kv.as_object().ok_or_else(unchecked)?;
                for (name, sub) in props {
                    if let Some(x) = o.get(name) {
                        self.at(x, sub, &key(name), depth + 1)?;
                    }
                }
                Ok(())
            }
            "required" => {
                let names = kv.as_array().ok_or_else(unchecked)?;
                match names
                    .iter()
                    .filter_map(Value::as_str)
                    .find(|n| !o.contains_key(*n))
                {
                    Some(missing) => Err(fails(
                        path,
                        format!("the required key {missing:?} is missing"),
                    )),
                    None => Ok(()),
                }
            }
            "additionalProperties" => {
                if s.contains_key("patternProperties") {
                    return Err(unchecked());
                }
                let declared = s.get("properties").and_then(Value::as_object);
                for (name, x) in o {
                    if declared.is_some_and(|d| d.contains_key(name)) {
                        continue;
                    }
                    match self.at(x, kv, &key(name), depth + 1) {
                        Err(Invalid::Fails(_)) if kv == &Value::Bool(false) => {
                            return Err(fails(path, format!("the key {name:?} is not allowed")))
                        }
                        r => r?,
                    }
                }
                Ok(())
            }
            _ => {
                let n = count(s, k)?.ok_or_else(unchecked)?;
                if (k == "minProperties" && o.len() >= n) || (k == "maxProperties" && o.len() <= n)
                {
                    Ok(())
                } else {
                    Err(fails(path, format!("{} keys break `{k}: {n}`", o.len())))
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ok(v: Value, s: Value) -> bool {
        match check(&v, &s) {
            Ok(()) => true,
            Err(Invalid::Fails(_)) => false,
            Err(u) => panic!("{u:?}"),
        }
    }

    /// A pydantic-style schema as LangChain sends a tool's: every case's
    /// verdict follows from the keywords' definitions (JSON Schema 2020-12,
    /// Validation, section 6).
    #[test]
    fn a_tool_schema_passes_and_fails_as_its_keywords_say() {
        let s = json!({
            "title": "multiply", "description": "Multiply two integers.",
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer", "minimum": 0},
                           "unit": {"enum": ["m", "s"]}, "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2},
                           "note": {"anyOf": [{"type": "string", "maxLength": 3}, {"type": "null"}], "default": null}},
            "required": ["a", "b"],
            "additionalProperties": false,
        });
        assert!(ok(json!({"a": 3, "b": 4}), s.clone()));
        assert!(ok(
            json!({"a": 3.0, "b": 0, "unit": "m", "tags": ["x", "y"], "note": null}),
            s.clone()
        ));
        assert!(ok(json!({"a": 1, "b": 1, "note": "abc"}), s.clone()));
        for bad in [
            json!({"a": 3}),                                  // required b missing
            json!({"a": "3", "b": 4}),                        // a string is no integer
            json!({"a": 3.5, "b": 4}),                        // 3.5 has a fraction
            json!({"a": 3, "b": -1}),                         // below the minimum
            json!({"a": 3, "b": 4, "c": 1}),                  // no additional keys
            json!({"a": 3, "b": 4, "unit": "kg"}),            // not in the enum
            json!({"a": 3, "b": 4, "tags": ["x", "y", "z"]}), // 3 > maxItems 2
            json!({"a": 3, "b": 4, "tags": [1]}),             // items are strings
            json!({"a": 1, "b": 1, "note": "abcd"}),          // neither branch of anyOf
            json!([3, 4]),                                    // not an object
        ] {
            assert!(!ok(bad.clone(), s.clone()), "{bad}");
        }
    }

    #[test]
    fn references_one_of_not_and_patterns() {
        let s = json!({
            "$defs": {"Point": {"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]}},
            "type": "object",
            "properties": {"p": {"$ref": "#/$defs/Point"},
                           "k": {"oneOf": [{"type": "integer"}, {"type": "number", "minimum": 10}]},
                           "tz": {"type": "string", "pattern": "^[A-Z][a-z]+/[A-Z][a-z]+$"},
                           "n": {"not": {"const": 0}}},
        });
        assert!(ok(
            json!({"p": {"x": 1.5}, "k": 3, "tz": "Europe/Paris", "n": 1}),
            s.clone()
        ));
        assert!(!ok(json!({"p": {"y": 1}}), s.clone()));
        // 12 is an integer and a number >= 10: both branches, so oneOf fails.
        assert!(!ok(json!({"k": 12}), s.clone()));
        assert!(ok(json!({"k": 12.5}), s.clone()));
        assert!(!ok(json!({"tz": "paris"}), s.clone()));
        assert!(!ok(json!({"n": 0.0}), s.clone()));
        assert!(ok(json!(1), json!(true)));
        assert!(!ok(json!(1), json!(false)));
    }

    #[test]
    fn keywords_it_cannot_check_are_named_not_passed() {
        for s in [
            json!({"patternProperties": {"^x": {}}}),
            json!({"if": {"type": "string"}, "then": {"minLength": 1}}),
            json!({"$ref": "https://example.com/s.json"}),
            json!({"$ref": "#/$defs/missing"}),
            json!({"type": "string", "pattern": "(?<=a)b"}),
            json!({"type": "decimal"}),
        ] {
            assert!(
                matches!(check(&json!("a"), &s), Err(Invalid::Unchecked(_))),
                "{s}"
            );
        }
        // A loop of references ends at the depth bound, unchecked.
        let lp = json!({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"});
        assert!(matches!(check(&json!(1), &lp), Err(Invalid::Unchecked(_))));
    }
}

//! A parsed call's arguments checked against the tool's JSON Schema, so that a call the
//! client's code would choke on (a missing required argument, a number where a string
//! belongs, a value outside an `enum`) stays text instead. The common keywords of function
//! schemas are checked (`type`, `enum`, `const`, `required`, `properties`,
//! `additionalProperties: false`, `items`, `anyOf`/`oneOf`/`allOf`); others are ignored,
//! so an unusual schema never rejects a call it cannot judge.

use serde_json::Value;

/// Whether `value` fits `schema` as far as the checked keywords tell.
pub fn fits(value: &Value, schema: &Value) -> bool {
    fits_at(value, schema, 0)
}

fn fits_at(value: &Value, schema: &Value, depth: usize) -> bool {
    let Value::Object(s) = schema else {
        // `true`, `false` and anything odd: only `false` refuses.
        return schema != &Value::Bool(false);
    };
    if depth > 64 {
        return true;
    }
    if let Some(kind) = s.get("type") {
        let ok = match kind {
            Value::String(k) => has_type(value, k),
            Value::Array(kinds) => kinds
                .iter()
                .any(|k| k.as_str().is_some_and(|k| has_type(value, k))),
            _ => true,
        };
        if !ok {
            return false;
        }
    }
    if let Some(Value::Array(options)) = s.get("enum") {
        if !options.contains(value) {
            return false;
        }
    }
    if let Some(expected) = s.get("const") {
        if expected != value {
            return false;
        }
    }
    for (key, all) in [("anyOf", false), ("oneOf", false), ("allOf", true)] {
        if let Some(Value::Array(options)) = s.get(key) {
            let mut each = options.iter().map(|o| fits_at(value, o, depth + 1));
            let ok = if all {
                each.all(|f| f)
            } else {
                options.is_empty() || each.any(|f| f)
            };
            if !ok {
                return false;
            }
        }
    }
    if let Value::Object(object) = value {
        if let Some(Value::Array(required)) = s.get("required") {
            if required
                .iter()
                .any(|r| r.as_str().is_some_and(|r| !object.contains_key(r)))
            {
                return false;
            }
        }
        let properties = s.get("properties").and_then(Value::as_object);
        if let Some(properties) = properties {
            for (key, v) in object {
                match properties.get(key) {
                    Some(sub) if !fits_at(v, sub, depth + 1) => return false,
                    None if s.get("additionalProperties") == Some(&Value::Bool(false)) => {
                        return false
                    }
                    _ => {}
                }
            }
        }
    }
    if let (Value::Array(items), Some(item_schema)) = (value, s.get("items")) {
        if !items.iter().all(|i| fits_at(i, item_schema, depth + 1)) {
            return false;
        }
    }
    true
}

fn has_type(value: &Value, kind: &str) -> bool {
    match kind {
        "object" => value.is_object(),
        "array" => value.is_array(),
        "string" => value.is_string(),
        "boolean" => value.is_boolean(),
        "null" => value.is_null(),
        "number" => value.is_number(),
        "integer" => {
            value.is_i64() || value.is_u64() || value.as_f64().is_some_and(|f| f.fract() == 0.0)
        }
        // An unknown type name cannot be judged.
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::fits;
    use serde_json::json;

    #[test]
    fn common_keywords_are_checked() {
        let schema = json!({
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"type": "string", "enum": ["c", "f"]},
                "days": {"type": "integer"},
                "tags": {"type": "array", "items": {"type": "string"}},
                "when": {"anyOf": [{"type": "string"}, {"type": "null"}]}
            },
            "required": ["city"],
            "additionalProperties": false
        });
        assert!(fits(&json!({"city": "Paris"}), &schema));
        assert!(fits(
            &json!({"city": "Paris", "unit": "c", "days": 3.0, "tags": ["a"], "when": null}),
            &schema
        ));
        for bad in [
            json!({}),
            json!({"city": 5}),
            json!({"city": "Paris", "unit": "k"}),
            json!({"city": "Paris", "days": 1.5}),
            json!({"city": "Paris", "tags": [1]}),
            json!({"city": "Paris", "when": 3}),
            json!({"city": "Paris", "extra": true}),
            json!([]),
        ] {
            assert!(!fits(&bad, &schema), "{bad}");
        }
        // What cannot be judged is accepted.
        assert!(fits(
            &json!({"a": 1}),
            &json!({"type": "object", "patternProperties": {"x": false}})
        ));
        assert!(fits(&json!({"a": 1}), &json!(true)));
        assert!(!fits(&json!({"a": 1}), &json!(false)));
    }
}

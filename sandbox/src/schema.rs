//! A small subset of JSON Schema for capability arguments: `type`
//! (string, number, integer, boolean, object, array, null, or a list of
//! them), `properties`, `required`, `additionalProperties: false`, `items`,
//! `enum`, `minimum`, `maximum`, `maxLength`, `maxItems`. Enough to refuse a
//! malformed call before the host acts on it; the message is safe to show
//! to the script.

use serde_json::Value;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{path}: {message}")]
pub struct SchemaError {
    pub path: String,
    pub message: String,
}

/// Deepest nesting checked; deeper values are refused.
const MAX_DEPTH: usize = 64;

pub fn validate(schema: &Value, value: &Value) -> Result<(), SchemaError> {
    check(schema, value, "$", 0)
}

fn err(path: &str, message: impl Into<String>) -> SchemaError {
    SchemaError {
        path: path.to_string(),
        message: message.into(),
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn type_matches(t: &str, v: &Value) -> bool {
    match t {
        "number" => v.is_number(),
        "integer" => v.as_f64().is_some_and(|f| f.fract() == 0.0),
        other => type_name(v) == other,
    }
}

fn check(schema: &Value, v: &Value, path: &str, depth: usize) -> Result<(), SchemaError> {
    if depth > MAX_DEPTH {
        return Err(err(path, "nested too deeply"));
    }
    let Some(s) = schema.as_object() else {
        // `true` or an empty schema accepts anything.
        return Ok(());
    };
    if let Some(t) = s.get("type") {
        let ok = match t {
            Value::String(t) => type_matches(t, v),
            Value::Array(ts) => ts
                .iter()
                .filter_map(Value::as_str)
                .any(|t| type_matches(t, v)),
            _ => true,
        };
        if !ok {
            return Err(err(
                path,
                format!(
                    "expected {}, got {}",
                    t.as_str()
                        .map(str::to_string)
                        .unwrap_or_else(|| t.to_string()),
                    type_name(v)
                ),
            ));
        }
    }
    if let Some(e) = s.get("enum").and_then(Value::as_array) {
        if !e.contains(v) {
            return Err(err(path, "not one of the allowed values"));
        }
    }
    if let Some(n) = v.as_f64() {
        if s.get("minimum")
            .and_then(Value::as_f64)
            .is_some_and(|m| n < m)
        {
            return Err(err(path, "below the minimum"));
        }
        if s.get("maximum")
            .and_then(Value::as_f64)
            .is_some_and(|m| n > m)
        {
            return Err(err(path, "above the maximum"));
        }
    }
    if let Some(st) = v.as_str() {
        if s.get("maxLength")
            .and_then(Value::as_u64)
            .is_some_and(|m| st.chars().count() as u64 > m)
        {
            return Err(err(path, "string too long"));
        }
    }
    if let Some(a) = v.as_array() {
        if s.get("maxItems")
            .and_then(Value::as_u64)
            .is_some_and(|m| a.len() as u64 > m)
        {
            return Err(err(path, "too many items"));
        }
        if let Some(items) = s.get("items") {
            for (i, x) in a.iter().enumerate() {
                check(items, x, &format!("{path}[{i}]"), depth + 1)?;
            }
        }
    }
    if let Some(o) = v.as_object() {
        let props = s.get("properties").and_then(Value::as_object);
        if let Some(req) = s.get("required").and_then(Value::as_array) {
            for r in req.iter().filter_map(Value::as_str) {
                if !o.contains_key(r) {
                    return Err(err(path, format!("missing required property {r:?}")));
                }
            }
        }
        for (k, x) in o {
            match props.and_then(|p| p.get(k)) {
                Some(ps) => check(ps, x, &format!("{path}.{k}"), depth + 1)?,
                None => {
                    if s.get("additionalProperties") == Some(&Value::Bool(false)) {
                        return Err(err(path, format!("unexpected property {k:?}")));
                    }
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn validates_common_shapes() {
        let s = json!({"type": "object", "required": ["cmd"], "additionalProperties": false,
            "properties": {"cmd": {"type": "string", "maxLength": 10}, "n": {"type": "integer", "minimum": 0}}});
        assert!(validate(&s, &json!({"cmd": "ls"})).is_ok());
        assert!(validate(&s, &json!({"cmd": "ls", "n": 2})).is_ok());
        assert!(validate(&s, &json!({})).is_err());
        assert!(validate(&s, &json!({"cmd": 1})).is_err());
        assert!(validate(&s, &json!({"cmd": "ls", "x": 1})).is_err());
        assert!(validate(&s, &json!({"cmd": "ls", "n": -1})).is_err());
        assert!(validate(&s, &json!({"cmd": "01234567890"})).is_err());
        assert!(validate(&s, &json!("str")).is_err());
        assert!(validate(&json!({"type": ["string", "null"]}), &json!(null)).is_ok());
        assert!(validate(
            &json!({"type": "array", "items": {"type": "number"}}),
            &json!([1, "x"])
        )
        .is_err());
    }
}

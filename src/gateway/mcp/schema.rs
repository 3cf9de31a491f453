//! Portable tool schemas: schemars' JSON Schemas rewritten so that strict
//! validators (AJV strict mode, the MCP Inspector) accept them silently.

use rmcp::model::JsonObject;
use serde_json::Value;

/// JSON Schema formats every validator knows (others, such as schemars' `uint64`, draw warnings).
const STANDARD_FORMATS: &[&str] = &[
    "date-time",
    "date",
    "time",
    "duration",
    "email",
    "idn-email",
    "hostname",
    "idn-hostname",
    "ipv4",
    "ipv6",
    "uri",
    "uri-reference",
    "iri",
    "iri-reference",
    "uuid",
    "uri-template",
    "json-pointer",
    "relative-json-pointer",
    "regex",
];

/// Keywords that describe the value whatever its type (kept beside an `anyOf` of types).
const ANNOTATIONS: &[&str] = &["description", "title", "default", "examples", "deprecated", "readOnly", "writeOnly"];

/// Rewrites a schemars schema so strict validators (AJV strict mode, the MCP Inspector) accept it
/// silently: non-standard `format`s are dropped, and `"type": [T, "null"]` becomes
/// `anyOf: [{type: T, ...its keywords}, {type: "null"}]`, so each keyword sits beside its type.
pub fn portable_schema_object(schema: &JsonObject) -> JsonObject {
    match portable(Value::Object(schema.clone())) {
        Value::Object(object) => object,
        _ => schema.clone(),
    }
}

fn portable(value: Value) -> Value {
    match value {
        Value::Object(object) => Value::Object(portable_object(object)),
        Value::Array(items) => Value::Array(items.into_iter().map(portable).collect()),
        other => other,
    }
}

fn portable_object(object: JsonObject) -> JsonObject {
    let mut out = JsonObject::new();
    for (key, value) in object {
        let value = match key.as_str() {
            // Maps of schemas: rewrite each schema, keep the property names.
            "properties" | "$defs" | "definitions" | "patternProperties" => match value {
                Value::Object(map) => Value::Object(map.into_iter().map(|(k, v)| (k, portable(v))).collect()),
                other => other,
            },
            "format" if value.as_str().is_some_and(|f| !STANDARD_FORMATS.contains(&f)) => continue,
            _ => portable(value),
        };
        out.insert(key, value);
    }
    let Some(Value::Array(types)) = out.get("type").cloned() else { return out };
    let names: Vec<String> = types.iter().filter_map(|t| t.as_str().map(str::to_string)).collect();
    if names.len() == 1 {
        out.insert("type".into(), Value::String(names[0].clone()));
        return out;
    }
    out.remove("type");
    let mut outer = JsonObject::new();
    let mut inner = JsonObject::new();
    for (key, value) in out {
        if ANNOTATIONS.contains(&key.as_str()) {
            outer.insert(key, value);
        } else {
            inner.insert(key, value);
        }
    }
    let branches: Vec<Value> = names
        .iter()
        .map(|name| {
            let mut branch = JsonObject::new();
            branch.insert("type".into(), Value::String(name.clone()));
            if name != "null" {
                for (key, value) in &inner {
                    if keyword_applies(key, name) {
                        branch.insert(key.clone(), value.clone());
                    }
                }
            }
            Value::Object(branch)
        })
        .collect();
    outer.insert("anyOf".into(), Value::Array(branches));
    outer
}

/// Whether a validation keyword applies to values of a JSON type (so it may sit beside that type).
fn keyword_applies(keyword: &str, type_name: &str) -> bool {
    let numeric = ["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"];
    let string = ["minLength", "maxLength", "pattern", "format"];
    let array = ["items", "minItems", "maxItems", "uniqueItems", "prefixItems", "contains"];
    let object = ["properties", "required", "additionalProperties", "patternProperties", "propertyNames"];
    if numeric.contains(&keyword) {
        return type_name == "integer" || type_name == "number";
    }
    if string.contains(&keyword) {
        return type_name == "string";
    }
    if array.contains(&keyword) {
        return type_name == "array";
    }
    if object.contains(&keyword) {
        return type_name == "object";
    }
    true
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn obj(value: Value) -> JsonObject {
        match value {
            Value::Object(o) => o,
            _ => JsonObject::new(),
        }
    }

    #[test]
    fn nullable_integers_become_any_of_without_custom_formats() {
        let schema = obj(json!({
            "type": "object",
            "properties": {
                "timeout": {"type": ["integer", "null"], "format": "uint64", "minimum": 0, "description": "d"},
                "n": {"type": "integer", "format": "int64"},
                "when": {"type": "string", "format": "date-time"},
                "f": {"type": ["number", "null"], "format": "double"}
            },
            "required": ["n"]
        }));
        let out = Value::Object(portable_schema_object(&schema));
        assert_eq!(
            out["properties"]["timeout"],
            json!({"description": "d", "anyOf": [{"type": "integer", "minimum": 0}, {"type": "null"}]})
        );
        assert_eq!(out["properties"]["n"], json!({"type": "integer"}));
        assert_eq!(out["properties"]["when"], json!({"type": "string", "format": "date-time"}));
        assert_eq!(out["properties"]["f"], json!({"anyOf": [{"type": "number"}, {"type": "null"}]}));
        assert_eq!(out["required"], json!(["n"]));
    }
}

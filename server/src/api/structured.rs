//! Which grammar a request asks for: OpenAI's `response_format`, vLLM's `structured_outputs`
//! or one of vLLM's older `guided_*` fields. At most one of them may be given.

use llguidance::api::TopLevelGrammar;
use serde_json::Value;

use super::error::ApiError;
use super::types::CommonParams;
use crate::api::chat::short;

/// The grammar of a request and the field it came from (named in compile errors).
#[derive(Debug)]
pub struct Requested {
    /// The request field, e.g. `response_format.json_schema.schema`.
    pub field: String,
    /// What llguidance compiles.
    pub grammar: TopLevelGrammar,
    /// The same constraint as a Lark expression, to offer it beside tool calls (`None` for a
    /// Lark grammar, which cannot be embedded).
    pub answer: Option<String>,
}

/// Turns one field's value into its grammar.
type Reader = fn(&str, &Value) -> Result<Requested, ApiError>;

/// Reads the request's structured-output fields; `None` when it asks for free text.
pub fn requested_grammar(c: &CommonParams) -> Result<Option<Requested>, ApiError> {
    let mut found: Vec<Requested> = Vec::new();
    if let Some(rf) = c.response_format.as_ref().filter(|v| !v.is_null()) {
        found.extend(response_format(rf)?);
    }
    if let Some(so) = c.structured_outputs.as_ref().filter(|v| !v.is_null()) {
        let obj = so.as_object().ok_or_else(|| ApiError::invalid("structured_outputs", "an object", short(so)))?;
        for (k, v) in obj.iter().filter(|(_, v)| !v.is_null()) {
            let field = format!("structured_outputs.{k}");
            match k.as_str() {
                "json" => found.push(json(&field, v)?),
                "regex" => found.push(regex(&field, v)?),
                "choice" => found.push(choice(&field, v)?),
                "grammar" => found.push(lark(&field, v)?),
                "json_object" if v.as_bool() == Some(true) => found.push(any_object(&field)),
                "json_object" => {}
                _ => {
                    return Err(ApiError::invalid(&field, "one of json, regex, choice, grammar, json_object", short(v)));
                }
            }
        }
    }
    let guided: [(&str, &Option<Value>, Reader); 4] = [
        ("guided_json", &c.guided_json, json),
        ("guided_regex", &c.guided_regex, regex),
        ("guided_choice", &c.guided_choice, choice),
        ("guided_grammar", &c.guided_grammar, lark),
    ];
    for (field, v, make) in guided {
        if let Some(v) = v.as_ref().filter(|v| !v.is_null()) {
            found.push(make(field, v)?);
        }
    }
    if found.len() > 1 {
        let fields: Vec<&str> = found.iter().map(|r| r.field.as_str()).collect();
        return Err(ApiError::bad_request(
            format!("at most one structured-output constraint may be given; got {}", fields.join(", ")),
            Some(&found[1].field),
            "invalid_value",
        ));
    }
    Ok(found.pop())
}

/// `response_format`: `text`, `json_object` or `json_schema`.
fn response_format(rf: &Value) -> Result<Option<Requested>, ApiError> {
    let expected = r#"{"type": "text" | "json_object" | "json_schema", ...}"#;
    match rf.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(any_object("response_format"))),
        Some("json_schema") => {
            let schema = rf.get("json_schema").and_then(|j| j.get("schema"));
            match schema {
                Some(s) if s.is_object() || s.is_boolean() => Ok(Some(json("response_format.json_schema.schema", s)?)),
                Some(s) => Err(ApiError::invalid("response_format.json_schema.schema", "a JSON schema object", short(s))),
                None => Err(ApiError::invalid("response_format.json_schema.schema", "a JSON schema object", "nothing")),
            }
        }
        _ => Err(ApiError::invalid("response_format.type", expected, short(rf))),
    }
}

/// Any JSON object (`json_object` mode).
fn any_object(field: &str) -> Requested {
    json_requested(field, serde_json::json!({"type": "object"}))
}

fn json_requested(field: &str, schema: Value) -> Requested {
    let schema = compact(schema);
    Requested { field: field.into(), answer: Some(format!("%json {schema}")), grammar: TopLevelGrammar::from_json_schema(schema) }
}

fn regex_requested(field: &str, rx: &str) -> Requested {
    Requested { field: field.into(), answer: Some(format!("/{}/", rx.replace('/', "\\/"))), grammar: TopLevelGrammar::from_regex(rx) }
}

/// A JSON schema, given as an object or as a string holding one (vLLM accepts both).
fn json(field: &str, v: &Value) -> Result<Requested, ApiError> {
    let schema = match v {
        Value::String(s) => {
            serde_json::from_str(s).map_err(|e| ApiError::invalid(field, "a JSON schema", format!("unparsable JSON ({e})")))?
        }
        Value::Object(_) | Value::Bool(_) => v.clone(),
        other => return Err(ApiError::invalid(field, "a JSON schema object", short(other))),
    };
    Ok(json_requested(field, schema))
}

/// JSON in one line with `", "` and `": "` separators, unless the schema sets llguidance's own
/// options (`x-guidance`): free whitespace lets a weak model pad forever instead of finishing.
fn compact(mut schema: Value) -> Value {
    if let Some(obj) = schema.as_object_mut() {
        obj.entry("x-guidance")
            .or_insert_with(|| serde_json::json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}));
    }
    schema
}

fn regex(field: &str, v: &Value) -> Result<Requested, ApiError> {
    let rx = v.as_str().ok_or_else(|| ApiError::invalid(field, "a regular expression string", short(v)))?;
    Ok(regex_requested(field, rx))
}

/// One of a list of strings, exactly.
fn choice(field: &str, v: &Value) -> Result<Requested, ApiError> {
    let items: Vec<&str> = v.as_array().map(|a| a.iter().filter_map(Value::as_str).collect()).unwrap_or_default();
    if items.is_empty() || items.len() != v.as_array().map_or(0, Vec::len) {
        return Err(ApiError::invalid(field, "a non-empty list of strings", short(v)));
    }
    let alternatives: Vec<String> = items.iter().map(|s| regex::escape(s)).collect();
    Ok(regex_requested(field, &format!("(?:{})", alternatives.join("|"))))
}

/// A Lark grammar (llguidance's dialect, which also takes `%json {...}` rules).
fn lark(field: &str, v: &Value) -> Result<Requested, ApiError> {
    let g = v.as_str().ok_or_else(|| ApiError::invalid(field, "a Lark grammar string", short(v)))?;
    Ok(Requested { field: field.into(), grammar: TopLevelGrammar::from_lark(g.to_owned()), answer: None })
}

//! Tool definitions (`tools`), `tool_choice` and `parallel_tool_calls` of a chat request, and
//! the grammar that makes a required or named call well-formed in the model's own syntax.

use serde_json::{json, Value};

use super::short;
use crate::api::error::ApiError;

/// The tool-call syntax of a model family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolSyntax {
    /// `<tool_call>\n{"name": …, "arguments": {…}}\n</tool_call>` (Qwen3, Hermes).
    Json,
    /// `<tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n</function>\n</tool_call>`
    /// (Qwen3.5, Qwen3-Coder).
    Xml,
}

impl ToolSyntax {
    /// The syntax a chat template teaches, read from its text.
    pub fn detect(template: &str) -> Option<Self> {
        if template.contains("<function=") {
            Some(Self::Xml)
        } else if template.contains("<tool_call>") {
            Some(Self::Json)
        } else {
            None
        }
    }

    /// vLLM's name for the parser of this syntax.
    pub fn name(self) -> &'static str {
        match self {
            Self::Json => "hermes",
            Self::Xml => "qwen3_xml",
        }
    }
}

/// One function a request offers the model.
#[derive(Debug, Clone, PartialEq)]
pub struct Tool {
    /// Function name.
    pub name: String,
    /// Its JSON schema of arguments (`{"type": "object"}` when none was given).
    pub parameters: Value,
}

/// A request's tools, in order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ToolSet {
    /// The functions.
    pub tools: Vec<Tool>,
}

/// What the model may or must do with the tools.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    /// Answer in text; the tools are not shown to the model.
    None,
    /// Call tools or answer, as the model decides.
    Auto,
    /// Call at least one tool.
    Required,
    /// Call this function.
    Named(String),
}

fn valid_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= 64 && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

impl ToolSet {
    /// Reads `tools`: `[{"type": "function", "function": {"name", "description"?,
    /// "parameters"?}}]`.
    pub fn parse(v: Option<&Value>) -> Result<Self, ApiError> {
        let Some(v) = v.filter(|v| !v.is_null()) else { return Ok(Self::default()) };
        let list =
            v.as_array().ok_or_else(|| ApiError::invalid("tools", "a list of {\"type\": \"function\", \"function\": {...}}", short(v)))?;
        let mut tools: Vec<Tool> = Vec::with_capacity(list.len());
        for (i, t) in list.iter().enumerate() {
            let at = format!("tools[{i}]");
            if t.get("type").and_then(Value::as_str) != Some("function") {
                return Err(ApiError::invalid(&format!("{at}.type"), "`function`", short(t.get("type").unwrap_or(&Value::Null))));
            }
            let f = t.get("function").filter(|f| f.is_object()).ok_or_else(|| {
                ApiError::invalid(
                    &format!("{at}.function"),
                    "{name, description, parameters}",
                    short(t.get("function").unwrap_or(&Value::Null)),
                )
            })?;
            let name = f.get("name").and_then(Value::as_str).unwrap_or_default();
            if !valid_name(name) {
                return Err(ApiError::invalid(
                    &format!("{at}.function.name"),
                    "1 to 64 letters, digits, `_`, `-` or `.`",
                    short(f.get("name").unwrap_or(&Value::Null)),
                ));
            }
            if tools.iter().any(|t| t.name == name) {
                return Err(ApiError::invalid(&format!("{at}.function.name"), "a name no other tool has", format!("{name:?} again")));
            }
            let parameters = match f.get("parameters") {
                None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
                Some(p @ Value::Object(_)) => p.clone(),
                Some(other) => return Err(ApiError::invalid(&format!("{at}.function.parameters"), "a JSON schema object", short(other))),
            };
            tools.push(Tool { name: name.to_owned(), parameters });
        }
        Ok(Self { tools })
    }

    /// The tool called `name`.
    pub fn get(&self, name: &str) -> Option<&Tool> {
        self.tools.iter().find(|t| t.name == name)
    }

    /// The JSON text of parameter `param` of function `function`, from the raw text of an XML
    /// call: converted to the type the tool's schema gives it (as vLLM's `qwen3_xml` does),
    /// kept a string when it has no other type or does not parse as one.
    pub fn convert(&self, function: &str, param: &str, raw: &str) -> String {
        let schema = self.get(function).and_then(|t| t.parameters.get("properties")).and_then(|p| p.get(param));
        let kind = schema.and_then(|s| match s.get("type") {
            Some(Value::String(t)) => Some(t.as_str()),
            Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).find(|t| *t != "null"),
            _ => None,
        });
        let parsed = match kind {
            Some("integer") => raw.trim().parse::<i64>().ok().map(Value::from),
            Some("number") => {
                let t = raw.trim();
                t.parse::<i64>()
                    .ok()
                    .map(Value::from)
                    .or_else(|| t.parse::<f64>().ok().and_then(serde_json::Number::from_f64).map(Value::Number))
            }
            Some("boolean") => match raw.trim().to_ascii_lowercase().as_str() {
                "true" => Some(Value::Bool(true)),
                "false" => Some(Value::Bool(false)),
                _ => None,
            },
            Some("object" | "array") => serde_json::from_str(raw.trim()).ok(),
            Some("null") if raw.trim() == "null" => Some(Value::Null),
            _ => None,
        };
        super::python::python_style(&parsed.unwrap_or_else(|| Value::String(raw.to_owned())))
    }
}

impl ToolChoice {
    /// Reads `tool_choice` (default `auto` with tools, `none` without).
    pub fn parse(v: Option<&Value>, tools: &ToolSet) -> Result<Self, ApiError> {
        let expected = "`none`, `auto`, `required` or {\"type\": \"function\", \"function\": {\"name\": ...}}";
        let choice = match v.filter(|v| !v.is_null()) {
            None if tools.tools.is_empty() => Self::None,
            None => Self::Auto,
            Some(Value::String(s)) => match s.as_str() {
                "none" => Self::None,
                "auto" => Self::Auto,
                "required" => Self::Required,
                _ => return Err(ApiError::invalid("tool_choice", expected, short(&Value::String(s.clone())))),
            },
            Some(o @ Value::Object(_)) => {
                let name = o.get("function").and_then(|f| f.get("name")).and_then(Value::as_str);
                match (o.get("type").and_then(Value::as_str), name) {
                    (Some("function"), Some(n)) => Self::Named(n.to_owned()),
                    _ => return Err(ApiError::invalid("tool_choice", expected, short(o))),
                }
            }
            Some(other) => return Err(ApiError::invalid("tool_choice", expected, short(other))),
        };
        match &choice {
            Self::Required | Self::Auto if tools.tools.is_empty() => {
                Err(ApiError::invalid("tool_choice", "`none` when no `tools` are given", short(v.unwrap_or(&Value::Null))))
            }
            Self::Named(n) if tools.get(n).is_none() => {
                let names: Vec<&str> = tools.tools.iter().map(|t| t.name.as_str()).collect();
                Err(ApiError::invalid(
                    "tool_choice.function.name",
                    format!("one of the tools' names ({})", names.join(", ")),
                    format!("{n:?}"),
                ))
            }
            _ => Ok(choice),
        }
    }
}

/// A Lark string literal.
fn lit(s: &str) -> String {
    Value::String(s.to_owned()).to_string()
}

/// JSON-schema options that make llguidance write JSON as Python's `json.dumps` does (the
/// spelling chat templates render tool calls with).
fn python_json(mut schema: Value) -> Value {
    if let Value::Object(m) = &mut schema {
        m.insert("x-guidance".into(), json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}));
    }
    schema
}

/// The grammar of a request's tool calls: those `tool_choice` requires, or with `auto` the calls
/// a structured answer may be given instead of.
#[derive(Debug, Clone)]
pub struct ToolGrammar {
    /// The model's syntax.
    pub syntax: ToolSyntax,
    /// The request's tools.
    pub tools: std::sync::Arc<ToolSet>,
    /// Only this function (a named `tool_choice`).
    pub only: Option<String>,
    /// More than one call allowed.
    pub parallel: bool,
    /// A call is required (`required` or named); otherwise (`auto`) the grammar applies only
    /// beside a structured answer.
    pub required: bool,
}

impl ToolGrammar {
    /// The Lark grammar: calls only, or (with `answer`, a Lark expression) calls or the answer.
    pub fn lark(&self, answer: Option<&str>) -> String {
        let mut g = call_grammar(self.syntax, &self.tools, self.only.as_deref(), self.parallel);
        if let Some(a) = answer {
            g = g.replacen("start: ", "start: answer | ", 1);
            g.push_str(&format!("answer: {a}\n"));
        }
        g
    }
}

/// The Lark grammar that allows only tool calls, in `syntax`, of `tools` (all, or the one
/// named): one call, or with `parallel` one or more, separated by newlines.
fn call_grammar(syntax: ToolSyntax, tools: &ToolSet, only: Option<&str>, parallel: bool) -> String {
    let offered: Vec<&Tool> = tools.tools.iter().filter(|t| only.is_none_or(|n| n == t.name)).collect();
    let mut g = String::new();
    g.push_str(if parallel {
        "start: calls\ncalls: (\"\\n\" | \"\\n\\n\")? call (\"\\n\" call)*\n"
    } else {
        "start: calls\ncalls: (\"\\n\" | \"\\n\\n\")? call\n"
    });
    match syntax {
        ToolSyntax::Json => {
            let alternatives: Vec<Value> = offered
                .iter()
                .map(|t| {
                    json!({
                        "type": "object",
                        "properties": {"name": {"const": t.name}, "arguments": t.parameters},
                        "required": ["name", "arguments"],
                        "additionalProperties": false
                    })
                })
                .collect();
            g.push_str("call: \"<tool_call>\\n\" body \"\\n</tool_call>\"\n");
            g.push_str(&format!("body: %json {}\n", python_json(json!({"anyOf": alternatives}))));
        }
        ToolSyntax::Xml => {
            let fns: Vec<String> = (0..offered.len()).map(|i| format!("f{i}")).collect();
            g.push_str(&format!("call: \"<tool_call>\\n\" ({}) \"</tool_call>\"\n", fns.join(" | ")));
            for (i, t) in offered.iter().enumerate() {
                let props = t.parameters.get("properties").and_then(Value::as_object).cloned().unwrap_or_default();
                let required: Vec<&str> = t
                    .parameters
                    .get("required")
                    .and_then(Value::as_array)
                    .map(|r| r.iter().filter_map(Value::as_str).collect())
                    .unwrap_or_default();
                let mut body = vec![lit(&format!("<function={}>\n", t.name))];
                for (j, (name, schema)) in props.iter().enumerate() {
                    let rule = format!("f{i}_{j}");
                    let open = lit(&format!("<parameter={name}>\n"));
                    let close = lit("\n</parameter>\n");
                    let typed = match schema.get("type") {
                        Some(Value::String(t)) => t != "string",
                        Some(Value::Array(ts)) => !ts.iter().any(|t| t == "string"),
                        _ => false,
                    };
                    if let Some(choices) = schema.get("enum").and_then(Value::as_array).filter(|c| c.iter().all(Value::is_string)) {
                        let alts: Vec<String> = choices.iter().filter_map(Value::as_str).map(lit).collect();
                        g.push_str(&format!("{rule}: {open} ({}) {close}\n", alts.join(" | ")));
                    } else if typed {
                        g.push_str(&format!("{rule}: {open} {rule}_v {close}\n{rule}_v: %json {}\n", python_json(schema.clone())));
                    } else if let Some(max) = schema.get("maxLength").and_then(Value::as_u64) {
                        // A bounded string: its length is the schema's.
                        let min = schema.get("minLength").and_then(Value::as_u64).unwrap_or(0).min(max);
                        g.push_str(&format!("{rule}: {open} {rule}_v {close}\n{rule}_v: /(?s:.{{{min},{max}}})/\n"));
                    } else {
                        // Free text up to the closing tag (which ends it, lazily).
                        g.push_str(&format!("{rule}: {open} {rule}_v\n{rule}_v[suffix={close}]: /(?s:.*)/\n"));
                    }
                    body.push(if required.contains(&name.as_str()) { rule } else { format!("{rule}?") });
                }
                body.push(lit("</function>\n"));
                g.push_str(&format!("f{i}: {}\n", body.join(" ")));
            }
        }
    }
    g
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weather() -> ToolSet {
        ToolSet::parse(Some(&json!([{"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}, "hot": {"type": "boolean"}, "at": {"type": ["number", "null"]}, "tags": {"type": "array"}},
            "required": ["city"]
        }}}])))
        .unwrap()
    }

    #[test]
    fn xml_values_take_their_schema_types() {
        let t = weather();
        assert_eq!(t.convert("get_weather", "city", "Zürich"), "\"Zürich\"");
        assert_eq!(t.convert("get_weather", "days", " 3 "), "3");
        assert_eq!(t.convert("get_weather", "days", "three"), "\"three\"");
        assert_eq!(t.convert("get_weather", "hot", "True"), "true");
        assert_eq!(t.convert("get_weather", "at", "2.5"), "2.5");
        assert_eq!(t.convert("get_weather", "tags", "[\"a\",\"b\"]"), "[\"a\", \"b\"]");
        assert_eq!(t.convert("get_weather", "unknown", "7"), "\"7\"");
        assert_eq!(t.convert("nope", "x", "1"), "\"1\"");
    }

    #[test]
    fn bad_tools_and_choices_name_the_field() {
        let e = ToolSet::parse(Some(&json!([{"type": "function", "function": {"name": "a b"}}]))).unwrap_err().to_string();
        assert!(e.contains("`tools[0].function.name`"), "{e}");
        let e = ToolSet::parse(Some(&json!([{"type": "retrieval"}]))).unwrap_err().to_string();
        assert!(e.contains("`tools[0].type`"), "{e}");
        let e = ToolSet::parse(Some(&json!([{"type": "function", "function": {"name": "f", "parameters": "x"}}]))).unwrap_err().to_string();
        assert!(e.contains("`tools[0].function.parameters`"), "{e}");
        let t = weather();
        let e = ToolChoice::parse(Some(&json!({"type": "function", "function": {"name": "nope"}})), &t).unwrap_err().to_string();
        assert!(e.contains("`tool_choice.function.name`") && e.contains("get_weather") && e.contains("\"nope\""), "{e}");
        let e = ToolChoice::parse(Some(&json!("required")), &ToolSet::default()).unwrap_err().to_string();
        assert!(e.contains("`tool_choice`"), "{e}");
        assert_eq!(ToolChoice::parse(None, &t).unwrap(), ToolChoice::Auto);
        assert_eq!(ToolChoice::parse(None, &ToolSet::default()).unwrap(), ToolChoice::None);
    }
}

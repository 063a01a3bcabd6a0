//! Chat prompts: `messages` (with tool calls and tool results) parsed and rendered with the
//! checkpoint's `chat_template` as Hugging Face's `apply_chat_template` does ([`template`]);
//! tool definitions and `tool_choice` ([`tools`]); the model's reasoning and tool-call syntax
//! parsed back out of its output ([`output`]).

use serde::Serialize;
use serde_json::Value;

use crate::api::error::ApiError;

pub mod output;
pub mod python;
pub mod template;
pub mod tools;

pub use template::ChatTemplate;

/// One parsed chat message, as the chat template sees it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq, Default)]
pub struct Message {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// The text (text parts joined; "" for an assistant turn that only called tools).
    pub content: String,
    /// The assistant's earlier reasoning (vLLM's field), when the client sends it back.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// The assistant's tool calls, `arguments` parsed into objects (templates iterate them).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<HistoryCall>>,
    /// Which call a `tool` message answers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// The participant's or the tool's name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// A tool call in the history.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct HistoryCall {
    /// The call's id, if the client kept it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Always `function`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Name and arguments.
    pub function: HistoryFunction,
}

/// The function of a [`HistoryCall`].
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct HistoryFunction {
    /// Function name.
    pub name: String,
    /// The arguments: the JSON the client sent as a string, parsed (as vLLM does before
    /// rendering, so that templates can iterate them).
    pub arguments: Value,
}

fn optional_string(m: &Value, key: &str, path: &str) -> Result<Option<String>, ApiError> {
    match m.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(ApiError::invalid(&format!("{path}.{key}"), "a string", short(other))),
    }
}

/// Parses `messages[i].tool_calls`.
fn parse_history_calls(v: &Value, i: usize) -> Result<Vec<HistoryCall>, ApiError> {
    let path = format!("messages[{i}].tool_calls");
    let list = v.as_array().ok_or_else(|| ApiError::invalid(&path, "a list of tool calls", short(v)))?;
    list.iter()
        .enumerate()
        .map(|(j, c)| {
            let at = format!("{path}[{j}]");
            let kind = c.get("type").and_then(Value::as_str).unwrap_or("function");
            if kind != "function" {
                return Err(ApiError::invalid(&format!("{at}.type"), "`function`", short(&c["type"])));
            }
            let f = c.get("function").ok_or_else(|| ApiError::invalid(&format!("{at}.function"), "{name, arguments}", "nothing"))?;
            let name = f.get("name").and_then(Value::as_str).filter(|n| !n.is_empty()).ok_or_else(|| {
                ApiError::invalid(&format!("{at}.function.name"), "a function name", short(f.get("name").unwrap_or(&Value::Null)))
            })?;
            let arguments = match f.get("arguments") {
                None | Some(Value::Null) => Value::Object(Default::default()),
                Some(Value::String(s)) if s.trim().is_empty() => Value::Object(Default::default()),
                Some(Value::String(s)) => serde_json::from_str(s).map_err(|e| {
                    ApiError::invalid(&format!("{at}.function.arguments"), format!("a JSON string ({e})"), short(&Value::String(s.clone())))
                })?,
                // Some clients send the object itself.
                Some(o @ Value::Object(_)) => o.clone(),
                Some(other) => return Err(ApiError::invalid(&format!("{at}.function.arguments"), "a JSON string", short(other))),
            };
            Ok(HistoryCall {
                id: optional_string(c, "id", &at)?,
                kind: "function".into(),
                function: HistoryFunction { name: name.to_owned(), arguments },
            })
        })
        .collect()
}

/// Parses `messages`: `[{role, content, ...}]`, content a string or a list of
/// `{type: "text", text}`; assistant turns may carry `tool_calls` and `reasoning_content`, and
/// `tool` turns a `tool_call_id`.
pub fn parse_messages(v: Option<&Value>) -> Result<Vec<Message>, ApiError> {
    let list = v
        .and_then(Value::as_array)
        .ok_or_else(|| ApiError::invalid("messages", "a non-empty array of {role, content}", v.map_or("nothing".into(), short)))?;
    if list.is_empty() {
        return Err(ApiError::invalid("messages", "a non-empty array of {role, content}", "[]"));
    }
    list.iter()
        .enumerate()
        .map(|(i, m)| {
            let role = match m.get("role").and_then(Value::as_str).unwrap_or_default() {
                // OpenAI's newer name for the system role; chat templates know `system`.
                "developer" => "system",
                r @ ("system" | "user" | "assistant" | "tool") => r,
                _ => {
                    return Err(ApiError::invalid(
                        &format!("messages[{i}].role"),
                        "one of `system`, `developer`, `user`, `assistant`, `tool`",
                        short(m.get("role").unwrap_or(&Value::Null)),
                    ))
                }
            };
            let content = match m.get("content") {
                Some(Value::String(s)) => s.clone(),
                // An assistant turn that only called tools has no content.
                Some(Value::Null) | None if role == "assistant" => String::new(),
                Some(Value::Array(parts)) => {
                    let mut text = String::new();
                    for (j, p) in parts.iter().enumerate() {
                        match (p.get("type").and_then(Value::as_str), p.get("text").and_then(Value::as_str)) {
                            (Some("text"), Some(t)) => text.push_str(t),
                            _ => {
                                return Err(ApiError::invalid(
                                    &format!("messages[{i}].content[{j}]"),
                                    "a text part {\"type\": \"text\", \"text\": ...}",
                                    short(p),
                                ))
                            }
                        }
                    }
                    text
                }
                other => {
                    return Err(ApiError::invalid(
                        &format!("messages[{i}].content"),
                        "a string or a list of text parts",
                        short(other.unwrap_or(&Value::Null)),
                    ))
                }
            };
            let path = format!("messages[{i}]");
            let tool_calls = match m.get("tool_calls") {
                None | Some(Value::Null) => None,
                Some(v) if role == "assistant" => Some(parse_history_calls(v, i)?),
                Some(v) => return Err(ApiError::invalid(&format!("{path}.tool_calls"), "absent on a non-assistant turn", short(v))),
            };
            Ok(Message {
                role: role.to_owned(),
                content,
                reasoning_content: optional_string(m, "reasoning_content", &path)?,
                tool_calls,
                tool_call_id: optional_string(m, "tool_call_id", &path)?,
                name: optional_string(m, "name", &path)?,
            })
        })
        .collect()
}

/// A JSON value abbreviated for error messages.
pub fn short(v: &Value) -> String {
    let s = v.to_string();
    if s.len() > 80 {
        let cut = (0..=80).rev().find(|&i| s.is_char_boundary(i)).unwrap_or(0);
        format!("{}…", &s[..cut])
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn parses_strings_and_text_parts() {
        let v = json!([{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"hi "},{"type":"text","text":"there"}]}]);
        let m = parse_messages(Some(&v)).unwrap();
        assert_eq!(m[1], Message { role: "user".into(), content: "hi there".into(), ..Message::default() });
    }

    #[test]
    fn bad_messages_name_the_field() {
        let e = parse_messages(Some(&json!([{"role":"function","content":"x"}]))).unwrap_err().to_string();
        assert!(e.contains("`messages[0].role`") && e.contains("\"function\""), "{e}");
        let e = parse_messages(Some(&json!([{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":"{oops"}}]}])))
            .unwrap_err()
            .to_string();
        assert!(e.contains("`messages[0].tool_calls[0].function.arguments`"), "{e}");
        let e = parse_messages(Some(&json!([{"role":"user","content":"x","tool_calls":[]}]))).unwrap_err().to_string();
        assert!(e.contains("`messages[0].tool_calls`"), "{e}");
        let e = parse_messages(Some(&json!([{"role":"user","content":[{"type":"image_url"}]}]))).unwrap_err().to_string();
        assert!(e.contains("`messages[0].content[0]`"), "{e}");
        assert!(parse_messages(Some(&json!([]))).is_err());
        let e = parse_messages(Some(&json!([{"role":"user","content":null}]))).unwrap_err().to_string();
        assert!(e.contains("`messages[0].content`"), "{e}");
    }

    #[test]
    fn developer_turns_are_system_turns_and_tool_call_turns_have_empty_content() {
        let m = parse_messages(Some(&json!([
            {"role":"developer","content":"be brief"},
            {"role":"user","content":"hi"},
            {"role":"assistant","content":null,"tool_calls":[]},
            {"role":"assistant"}
        ])))
        .unwrap();
        let roles: Vec<_> = m.iter().map(|m| (m.role.as_str(), m.content.as_str())).collect();
        assert_eq!(roles, vec![("system", "be brief"), ("user", "hi"), ("assistant", ""), ("assistant", "")]);
    }
}

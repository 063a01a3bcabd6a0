//! Chat prompts: `messages` parsed and rendered with the checkpoint's `chat_template` (Jinja,
//! via minijinja), as Hugging Face's `apply_chat_template` does.

use minijinja::{context, Environment, Error as JinjaError, ErrorKind};
use serde::Serialize;
use serde_json::Value;

use crate::api::error::ApiError;

/// One parsed chat message.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Message {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// The text (text parts joined).
    pub content: String,
}

/// Parses `messages`: `[{role, content}]`, content a string or a list of `{type: "text", text}`.
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
                r @ ("system" | "user" | "assistant") => r,
                _ => {
                    return Err(ApiError::invalid(
                        &format!("messages[{i}].role"),
                        "one of `system`, `developer`, `user`, `assistant`",
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
            Ok(Message { role: role.to_owned(), content })
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

/// A compiled chat template, or why the checkpoint's does not compile.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
    /// The compile error of a broken template: every render fails with it.
    broken: Option<String>,
}

fn raise_exception(msg: String) -> Result<String, JinjaError> {
    Err(JinjaError::new(ErrorKind::InvalidOperation, msg))
}

impl ChatTemplate {
    /// Compiles `template`; errors name the problem.
    pub fn new(template: &str, bos_token: Option<&str>, eos_token: Option<&str>) -> Result<Self, String> {
        let mut env = Environment::new();
        env.add_function("raise_exception", raise_exception);
        env.add_template_owned("chat", template.to_owned()).map_err(|e| format!("chat_template does not compile: {e}"))?;
        Ok(Self {
            env,
            bos_token: bos_token.unwrap_or_default().to_owned(),
            eos_token: eos_token.unwrap_or_default().to_owned(),
            broken: None,
        })
    }

    /// A template that failed to compile with `error`: chat requests fail with that error
    /// (500: the checkpoint is at fault, not the request).
    pub fn unusable(error: String) -> Self {
        Self { env: Environment::new(), bos_token: String::new(), eos_token: String::new(), broken: Some(error) }
    }

    /// Renders the prompt for `messages`, ending with the assistant turn's opening; `kwargs`
    /// (a JSON object, vLLM's `chat_template_kwargs`) adds template variables.
    pub fn render(&self, messages: &[Message], kwargs: Option<&serde_json::Value>) -> Result<String, ApiError> {
        if let Some(e) = &self.broken {
            return Err(ApiError::Internal(format!("this model's {e}")));
        }
        let t = self.env.get_template("chat").map_err(|e| ApiError::Internal(e.to_string()))?;
        let extra = match kwargs {
            None | Some(serde_json::Value::Null) => minijinja::Value::from(()),
            Some(o @ serde_json::Value::Object(_)) => minijinja::Value::from_serialize(o),
            Some(other) => return Err(ApiError::invalid("chat_template_kwargs", "an object", short(other))),
        };
        t.render(context! {
            messages => messages, add_generation_prompt => true, bos_token => &self.bos_token, eos_token => &self.eos_token, ..extra
        })
        .map_err(|e| ApiError::bad_request(format!("chat_template failed on these messages: {e}"), Some("messages"), "chat_template_error"))
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
        assert_eq!(m[1], Message { role: "user".into(), content: "hi there".into() });
    }

    #[test]
    fn chat_template_kwargs_reach_the_template() {
        let t = ChatTemplate::new(
            "{% if enable_thinking is defined and not enable_thinking %}<no-think>{% endif %}{{ messages[0].content }}",
            None,
            None,
        )
        .unwrap();
        let m = [Message { role: "user".into(), content: "hi".into() }];
        assert_eq!(t.render(&m, None).unwrap(), "hi");
        assert_eq!(t.render(&m, Some(&json!({"enable_thinking": false}))).unwrap(), "<no-think>hi");
        let e = t.render(&m, Some(&json!(["enable_thinking"]))).unwrap_err().to_string();
        assert!(e.contains("`chat_template_kwargs`"), "{e}");
    }

    #[test]
    fn bad_messages_name_the_field() {
        let e = parse_messages(Some(&json!([{"role":"tool","content":"x"}]))).unwrap_err().to_string();
        assert!(e.contains("`messages[0].role`") && e.contains("\"tool\""), "{e}");
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

    #[test]
    fn a_template_that_does_not_compile_fails_chat_with_its_error() {
        let e = ChatTemplate::new("{% for m in messages %}", None, None).err().unwrap();
        let t = ChatTemplate::unusable(e);
        let err = t.render(&[Message { role: "user".into(), content: "hi".into() }], None).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("chat_template does not compile") && !text.contains("no `chat_template`"), "{text}");
        assert_eq!(err.status(), 500);
    }

    #[test]
    fn renders_a_hf_style_template() {
        let t = ChatTemplate::new("{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}", Some("<s>"), None).unwrap();
        let out = t.render(&[Message { role: "user".into(), content: "hi".into() }], None).unwrap();
        assert_eq!(out, "<s><user>hi\n<assistant>");
        let t = ChatTemplate::new("{{ raise_exception('no system') }}", None, None).unwrap();
        assert!(t.render(&[], None).unwrap_err().to_string().contains("no system"));
    }
}

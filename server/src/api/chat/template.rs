//! The checkpoint's Jinja chat template (minijinja), made to render as transformers'
//! `apply_chat_template` does: Python string methods (`startswith`, `split`, …), transformers'
//! `tojson`, and Python's spelling of printed values (`True`, `None`, `1e-05`).

use minijinja::{context, Environment, Error as JinjaError, ErrorKind, Value as JinjaValue};
use serde_json::Value;

use super::tools::ToolSyntax;
use super::{python, short, Message};
use crate::api::error::ApiError;

/// A compiled chat template, or why the checkpoint's does not compile.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
    /// The compile error of a broken template: every render fails with it.
    broken: Option<String>,
    /// The tool-call syntax the template teaches the model, read from its text.
    pub tool_syntax: Option<ToolSyntax>,
    /// Whether the template knows `<think>` blocks (its model reasons before answering).
    pub thinks: bool,
}

fn raise_exception(msg: String) -> Result<String, JinjaError> {
    Err(JinjaError::new(ErrorKind::InvalidOperation, msg))
}

fn string_filter(v: JinjaValue) -> String {
    python::py_str(&v)
}

impl ChatTemplate {
    /// Compiles `template`; errors name the problem.
    pub fn new(template: &str, bos_token: Option<&str>, eos_token: Option<&str>) -> Result<Self, String> {
        let mut env = Environment::new();
        env.add_function("raise_exception", raise_exception);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", python::tojson);
        env.add_filter("string", string_filter);
        // Jinja2 prints values with Python's str(): `True`, `None`, `2.5`.
        env.set_formatter(|out, _state, value| {
            if value.is_safe() || value.as_str().is_some() {
                out.write_str(value.as_str().unwrap_or_default()).map_err(JinjaError::from)
            } else {
                out.write_str(&python::py_str(value)).map_err(JinjaError::from)
            }
        });
        env.add_template_owned("chat", template.to_owned()).map_err(|e| format!("chat_template does not compile: {e}"))?;
        Ok(Self {
            env,
            bos_token: bos_token.unwrap_or_default().to_owned(),
            eos_token: eos_token.unwrap_or_default().to_owned(),
            broken: None,
            tool_syntax: ToolSyntax::detect(template),
            thinks: template.contains("<think>") && template.contains("</think>"),
        })
    }

    /// A template that failed to compile with `error`: chat requests fail with that error
    /// (500: the checkpoint is at fault, not the request).
    pub fn unusable(error: String) -> Self {
        Self {
            env: Environment::new(),
            bos_token: String::new(),
            eos_token: String::new(),
            broken: Some(error),
            tool_syntax: None,
            thinks: false,
        }
    }

    /// Renders the prompt for `messages`, ending with the assistant turn's opening. `tools` (the
    /// request's definitions, as sent) reach the template as `tools`; `kwargs` (a JSON object,
    /// vLLM's `chat_template_kwargs`) adds template variables.
    pub fn render(&self, messages: &[Message], tools: Option<&Value>, kwargs: Option<&Value>) -> Result<String, ApiError> {
        if let Some(e) = &self.broken {
            return Err(ApiError::Internal(format!("this model's {e}")));
        }
        let t = self.env.get_template("chat").map_err(|e| ApiError::Internal(e.to_string()))?;
        let extra = match kwargs {
            None | Some(Value::Null) => JinjaValue::from(()),
            Some(o @ Value::Object(_)) => JinjaValue::from_serialize(o),
            Some(other) => return Err(ApiError::invalid("chat_template_kwargs", "an object", short(other))),
        };
        let tools = tools.map(JinjaValue::from_serialize).unwrap_or(JinjaValue::from(()));
        t.render(context! {
            messages => messages,
            tools => tools,
            add_generation_prompt => true,
            bos_token => &self.bos_token,
            eos_token => &self.eos_token,
            ..extra
        })
        .map_err(|e| ApiError::bad_request(format!("chat_template failed on these messages: {e}"), Some("messages"), "chat_template_error"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn user(text: &str) -> Message {
        Message { role: "user".into(), content: text.into(), ..Message::default() }
    }

    #[test]
    fn chat_template_kwargs_reach_the_template() {
        let t = ChatTemplate::new(
            "{% if enable_thinking is defined and not enable_thinking %}<no-think>{% endif %}{{ messages[0].content }}",
            None,
            None,
        )
        .unwrap();
        let m = [user("hi")];
        assert_eq!(t.render(&m, None, None).unwrap(), "hi");
        assert_eq!(t.render(&m, None, Some(&json!({"enable_thinking": false}))).unwrap(), "<no-think>hi");
        let e = t.render(&m, None, Some(&json!(["enable_thinking"]))).unwrap_err().to_string();
        assert!(e.contains("`chat_template_kwargs`"), "{e}");
    }

    #[test]
    fn a_template_that_does_not_compile_fails_chat_with_its_error() {
        let e = ChatTemplate::new("{% for m in messages %}", None, None).err().unwrap();
        let t = ChatTemplate::unusable(e);
        let err = t.render(&[user("hi")], None, None).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("chat_template does not compile") && !text.contains("no `chat_template`"), "{text}");
        assert_eq!(err.status(), 500);
    }

    #[test]
    fn renders_a_hf_style_template() {
        let t = ChatTemplate::new(
            "{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}",
            Some("<s>"),
            None,
        )
        .unwrap();
        assert_eq!(t.render(&[user("hi")], None, None).unwrap(), "<s><user>hi\n<assistant>");
        let t = ChatTemplate::new("{{ raise_exception('no system') }}", None, None).unwrap();
        assert!(t.render(&[], None, None).unwrap_err().to_string().contains("no system"));
    }

    #[test]
    fn python_methods_and_spellings_work_as_in_jinja2() {
        // Expected strings are what Jinja2 renders for these expressions.
        let t = ChatTemplate::new(
            "{{ messages[0].content.startswith('a') }}|{{ messages[0].content.split(',')[1].strip() }}|{{ x }}|{{ y | string }}|{{ z }}|{{ w | tojson }}",
            None,
            None,
        )
        .unwrap();
        let out = t.render(&[user("a, b ")], None, Some(&json!({"x": true, "y": null, "z": 0.00001, "w": {"k": "<é>"}}))).unwrap();
        assert_eq!(out, "True|b|True|None|1e-05|{\"k\": \"<é>\"}");
    }
}

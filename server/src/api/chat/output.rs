//! The model's output split the way OpenAI clients read it: `reasoning_content` (text inside a
//! `<think>` block), `content`, and `tool_calls` parsed from the tool-call syntax the chat
//! template taught the model — JSON inside `<tool_call>` tags (vLLM's `hermes` parser) or
//! Qwen3.5's XML-style `<function=…><parameter=…>` tags (vLLM's `qwen3_xml`).
//!
//! One incremental [`OutputParser`] serves both response modes: a stream feeds it each piece
//! of text as it is generated, a whole response feeds it everything at once, so both give the
//! same reasoning, content and calls.

use std::sync::Arc;

use serde_json::Value;

use super::python::python_style;
use super::tools::ToolSet;
pub use super::tools::ToolSyntax;

const THINK_OPEN: &str = "<think>";
/// The tag that ends a reasoning block.
pub const THINK_CLOSE: &str = "</think>";
const CALL_OPEN: &str = "<tool_call>";
const CALL_CLOSE: &str = "</tool_call>";

/// Whether a rendered chat prompt ends inside an open `<think>` block, so that the model's
/// output starts as reasoning.
pub fn prompt_opens_thinking(prompt: &str) -> bool {
    match prompt.rfind(THINK_OPEN) {
        Some(at) => !prompt[at..].contains(THINK_CLOSE),
        None => false,
    }
}

/// How to read one choice's output.
#[derive(Debug, Clone, Default)]
pub struct OutputConfig {
    /// Split out `<think>` blocks.
    pub reasoning: bool,
    /// The output starts inside a `<think>` block the prompt opened.
    pub starts_thinking: bool,
    /// Parse tool calls in this syntax.
    pub tool_syntax: Option<ToolSyntax>,
    /// The request's tools (argument types for the XML syntax).
    pub tools: Arc<ToolSet>,
}

/// One piece of a tool call: its start (`name`, empty `arguments`) or a fragment of its
/// arguments' JSON. Fragments of one call concatenate to a JSON object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallDelta {
    /// The call's position in this choice.
    pub index: usize,
    /// Set on the call's first delta.
    pub name: Option<String>,
    /// A fragment of the arguments' JSON text.
    pub arguments: String,
}

/// What a piece of output adds to each field.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Parts {
    /// Reasoning text.
    pub reasoning: String,
    /// Answer text.
    pub content: String,
    /// Tool-call pieces.
    pub calls: Vec<CallDelta>,
}

impl Parts {
    /// Whether nothing was added.
    pub fn is_empty(&self) -> bool {
        self.reasoning.is_empty() && self.content.is_empty() && self.calls.is_empty()
    }

    /// Appends `other`.
    pub fn extend(&mut self, other: Parts) {
        self.reasoning.push_str(&other.reasoning);
        self.content.push_str(&other.content);
        self.calls.extend(other.calls);
    }
}

/// A whole output, parsed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Parsed {
    /// Reasoning text (empty when none).
    pub reasoning: String,
    /// Answer text (empty when none).
    pub content: String,
    /// `(name, arguments JSON)` per call.
    pub calls: Vec<(String, String)>,
}

impl Parsed {
    /// Adds a piece.
    pub fn absorb(&mut self, p: Parts) {
        self.reasoning.push_str(&p.reasoning);
        self.content.push_str(&p.content);
        for c in p.calls {
            if let Some(name) = c.name {
                self.calls.push((name, String::new()));
            }
            if let Some(last) = self.calls.get_mut(c.index) {
                last.1.push_str(&c.arguments);
            }
        }
    }
}

/// Text with surrounding whitespace removed as it streams: leading whitespace is dropped and
/// trailing whitespace is held until more text follows it.
#[derive(Debug, Default)]
struct Trimmed {
    /// Pass text through untouched (plain chat: nothing is parsed, nothing trimmed).
    raw: bool,
    started: bool,
    held: String,
}

impl Trimmed {
    fn push(&mut self, text: &str, out: &mut String) {
        if self.raw {
            out.push_str(text);
            return;
        }
        let text = if self.started { text } else { text.trim_start() };
        if text.is_empty() {
            return;
        }
        self.started = true;
        let body = text.trim_end();
        if body.is_empty() {
            self.held.push_str(text);
            return;
        }
        out.push_str(&std::mem::take(&mut self.held));
        out.push_str(body);
        self.held.push_str(&text[body.len()..]);
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Phase {
    /// Before any text: a `<think>` may open here.
    Start,
    Reasoning,
    Content,
    /// Inside `<tool_call>`; for the XML syntax, whether `<function=…>` was read and how many
    /// parameters were written.
    Call {
        function: bool,
        params: usize,
    },
}

/// Splits one choice's output into reasoning, content and tool calls, incrementally.
#[derive(Debug)]
pub struct OutputParser {
    config: OutputConfig,
    phase: Phase,
    buf: String,
    reasoning: Trimmed,
    content: Trimmed,
    calls: usize,
    /// Names of the XML calls, by index (their parameters' types depend on them).
    names: Vec<String>,
}

/// The longest suffix of `s` that is a proper prefix of `tag` (held back: the tag may follow).
fn partial_tag(s: &str, tag: &str) -> usize {
    (1..tag.len().min(s.len() + 1)).rev().find(|&n| s.is_char_boundary(s.len() - n) && tag.starts_with(&s[s.len() - n..])).unwrap_or(0)
}

impl OutputParser {
    /// A parser for one choice.
    pub fn new(config: OutputConfig) -> Self {
        let phase = if config.reasoning && config.starts_thinking { Phase::Reasoning } else { Phase::Start };
        let content = Trimmed { raw: !config.reasoning && config.tool_syntax.is_none(), ..Trimmed::default() };
        Self { config, phase, buf: String::new(), reasoning: Trimmed::default(), content, calls: 0, names: Vec::new() }
    }

    /// How many tool calls were parsed so far.
    pub fn calls(&self) -> usize {
        self.calls
    }

    /// Takes in newly generated text; returns what can be told of it now.
    pub fn push(&mut self, text: &str) -> Parts {
        self.buf.push_str(text);
        let mut out = Parts::default();
        while self.step(&mut out, false) {}
        out
    }

    /// The output ended: releases everything held back.
    pub fn finish(&mut self) -> Parts {
        let mut out = Parts::default();
        while self.step(&mut out, true) {}
        out
    }

    /// Parses a whole output.
    pub fn parse_all(config: OutputConfig, text: &str) -> Parsed {
        let mut p = Self::new(config);
        let mut parsed = Parsed::default();
        parsed.absorb(p.push(text));
        parsed.absorb(p.finish());
        parsed
    }

    fn emit_content(&mut self, text: &str, out: &mut Parts) {
        self.content.push(text, &mut out.content);
    }

    /// One parsing step; false when it needs more text (or, at the end, is done).
    fn step(&mut self, out: &mut Parts, end: bool) -> bool {
        match self.phase.clone() {
            Phase::Start => {
                let lead = self.buf.len() - self.buf.trim_start().len();
                let rest = &self.buf[lead..];
                if self.config.reasoning && rest.starts_with(THINK_OPEN) {
                    self.buf.drain(..lead + THINK_OPEN.len());
                    self.phase = Phase::Reasoning;
                    return true;
                }
                if self.config.reasoning && !end && THINK_OPEN.starts_with(rest) {
                    return false;
                }
                self.phase = Phase::Content;
                true
            }
            Phase::Reasoning => {
                if let Some(at) = self.buf.find(THINK_CLOSE) {
                    let text: String = self.buf.drain(..at + THINK_CLOSE.len()).collect();
                    self.reasoning.push(&text[..at], &mut out.reasoning);
                    self.phase = Phase::Content;
                    return true;
                }
                let keep = if end { 0 } else { partial_tag(&self.buf, THINK_CLOSE) };
                let text: String = self.buf.drain(..self.buf.len() - keep).collect();
                self.reasoning.push(&text, &mut out.reasoning);
                false
            }
            Phase::Content => {
                if self.config.tool_syntax.is_none() {
                    let text = std::mem::take(&mut self.buf);
                    self.emit_content(&text, out);
                    return false;
                }
                if let Some(at) = self.buf.find(CALL_OPEN) {
                    let text: String = self.buf.drain(..at + CALL_OPEN.len()).collect();
                    self.emit_content(&text[..at], out);
                    self.phase = Phase::Call { function: false, params: 0 };
                    return true;
                }
                let keep = if end { 0 } else { partial_tag(&self.buf, CALL_OPEN) };
                let text: String = self.buf.drain(..self.buf.len() - keep).collect();
                self.emit_content(&text, out);
                false
            }
            Phase::Call { function, params } => match self.config.tool_syntax {
                Some(ToolSyntax::Xml) => self.step_xml(out, end, function, params),
                _ => self.step_json(out, end),
            },
        }
    }

    /// Inside a JSON `<tool_call>` block: waits for its end, then parses it whole.
    fn step_json(&mut self, out: &mut Parts, end: bool) -> bool {
        // A closing tag inside a JSON string (`"print('</tool_call>')"`) does not end the call.
        let close = self.buf.match_indices(CALL_CLOSE).map(|(at, _)| at).find(|&at| !inside_string(&self.buf[..at]));
        let (body, rest) = match close {
            Some(at) => (self.buf[..at].to_owned(), self.buf[at + CALL_CLOSE.len()..].to_owned()),
            None if end => (std::mem::take(&mut self.buf), String::new()),
            None => return false,
        };
        self.buf = rest;
        self.phase = Phase::Content;
        match json_call(&body) {
            Some((name, arguments)) => {
                let index = self.calls;
                self.calls += 1;
                out.calls.push(CallDelta { index, name: Some(name), arguments: String::new() });
                out.calls.push(CallDelta { index, name: None, arguments });
            }
            // Not a call after all: the text is the model's answer.
            None => {
                let closed = if end && !body.contains(CALL_CLOSE) { "" } else { CALL_CLOSE };
                self.emit_content(&format!("{CALL_OPEN}{body}{closed}"), out);
            }
        }
        true
    }

    /// Inside an XML `<tool_call>` block: the function's name starts the call, each complete
    /// parameter adds to its arguments, `</function>` closes them.
    fn step_xml(&mut self, out: &mut Parts, end: bool, function: bool, params: usize) -> bool {
        let lead = self.buf.len() - self.buf.trim_start().len();
        let rest = &self.buf[lead..];
        if !function {
            if let Some(after) = rest.strip_prefix("<function=") {
                if let Some(gt) = after.find('>') {
                    let name = after[..gt].trim().to_owned();
                    self.buf.drain(..lead + "<function=".len() + gt + 1);
                    out.calls.push(CallDelta { index: self.calls, name: Some(name.clone()), arguments: String::new() });
                    self.names.push(name);
                    self.calls += 1;
                    self.phase = Phase::Call { function: true, params: 0 };
                    return true;
                }
            }
            // A tag still arriving.
            if !end && ("<function=".starts_with(rest) || rest.starts_with("<function=")) {
                return false;
            }
            // Not a call: the text is the model's answer.
            let text = format!("{CALL_OPEN}{}", std::mem::take(&mut self.buf));
            self.phase = Phase::Content;
            self.emit_content(&text, out);
            return true;
        }
        let index = self.calls - 1;
        let close = |params: usize| if params == 0 { "{}" } else { "}" }.to_owned();
        if let Some(after) = rest.strip_prefix("<parameter=") {
            if let (Some(gt), Some(stop)) = (after.find('>'), after.find("</parameter>")) {
                if gt < stop {
                    let name = after[..gt].trim().to_owned();
                    let raw = &after[gt + 1..stop];
                    let raw = raw.strip_prefix('\n').unwrap_or(raw);
                    let raw = raw.strip_suffix('\n').unwrap_or(raw);
                    let value = self.config.tools.convert(&self.names[index], &name, raw);
                    let key = Value::String(name).to_string();
                    let sep = if params == 0 { "{" } else { ", " };
                    out.calls.push(CallDelta { index, name: None, arguments: format!("{sep}{key}: {value}") });
                    self.buf.drain(..lead + "<parameter=".len() + stop + "</parameter>".len());
                    self.phase = Phase::Call { function: true, params: params + 1 };
                    return true;
                }
            }
        } else if let Some(after) = rest.strip_prefix("</function>") {
            let after_ws = after.trim_start();
            if after_ws.starts_with(CALL_CLOSE) || end || (!after_ws.is_empty() && !CALL_CLOSE.starts_with(after_ws)) {
                let skip = if after_ws.starts_with(CALL_CLOSE) { after.len() - after_ws.len() + CALL_CLOSE.len() } else { 0 };
                self.buf.drain(..lead + "</function>".len() + skip);
                out.calls.push(CallDelta { index, name: None, arguments: close(params) });
                self.phase = Phase::Content;
                return true;
            }
        } else if rest.starts_with(CALL_CLOSE) {
            // A block closed without `</function>`.
            self.buf.drain(..lead + CALL_CLOSE.len());
            out.calls.push(CallDelta { index, name: None, arguments: close(params) });
            self.phase = Phase::Content;
            return true;
        } else if !rest.is_empty() && !"<parameter=".starts_with(rest) && !"</function>".starts_with(rest) && !CALL_CLOSE.starts_with(rest)
        {
            // Stray text between parameters: skipped up to the next tag.
            let skip = rest.find('<').filter(|&i| i > 0).unwrap_or(rest.len());
            self.buf.drain(..lead + skip);
            return true;
        }
        if end {
            // Cut off inside the call: keep what was complete and close the arguments.
            self.buf.clear();
            out.calls.push(CallDelta { index, name: None, arguments: close(params) });
            self.phase = Phase::Content;
            return true;
        }
        false
    }
}

/// Whether JSON text `s` ends inside a string literal.
fn inside_string(s: &str) -> bool {
    let (mut inside, mut escaped) = (false, false);
    for c in s.chars() {
        match (inside, escaped, c) {
            (true, true, _) => escaped = false,
            (true, false, '\\') => escaped = true,
            (_, false, '"') => inside = !inside,
            _ => {}
        }
    }
    inside
}

/// Parses a JSON call body: `{"name": …, "arguments": {…}}` (`parameters` accepted too;
/// arguments given as a JSON string are unwrapped). Returns the name and the arguments' JSON.
fn json_call(body: &str) -> Option<(String, String)> {
    let v: Value = serde_json::from_str(body.trim()).ok()?;
    let name = v.get("name")?.as_str()?.to_owned();
    let args = match v.get("arguments").or_else(|| v.get("parameters")) {
        None | Some(Value::Null) => Value::Object(Default::default()),
        Some(Value::String(s)) => serde_json::from_str(s).ok().filter(Value::is_object)?,
        Some(o @ Value::Object(_)) => o.clone(),
        Some(_) => return None,
    };
    Some((name, python_style(&args)))
}

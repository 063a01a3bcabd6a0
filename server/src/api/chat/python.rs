//! Python's spellings of template values, so that a chat template renders what transformers
//! renders: `json.dumps` (transformers' `tojson` filter), `str` (the `string` filter and
//! `{{ value }}`: `True`, `None`, `1e-05`) and `repr` (containers printed whole).

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Error, ErrorKind, Value};

/// `json.dumps` options that transformers' `tojson` exposes.
#[derive(Debug, Clone)]
pub struct DumpOptions {
    /// Escape non-ASCII as `\uXXXX` (transformers' default: false).
    pub ensure_ascii: bool,
    /// Pretty-print with this indent.
    pub indent: Option<String>,
    /// Item and key separators.
    pub separators: (String, String),
    /// Sort object keys.
    pub sort_keys: bool,
}

impl Default for DumpOptions {
    fn default() -> Self {
        Self { ensure_ascii: false, indent: None, separators: (", ".into(), ": ".into()), sort_keys: false }
    }
}

/// The `tojson` filter: `json.dumps(value, ensure_ascii=False, indent=None, separators=None,
/// sort_keys=False)` as transformers defines it (no HTML escaping, unlike Jinja's own).
pub fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let mut o = DumpOptions { ensure_ascii: kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false), ..DumpOptions::default() };
    o.sort_keys = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    let indent: Option<Value> = kwargs.get("indent")?;
    o.indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) if v.kind() == ValueKind::String => Some(v.as_str().unwrap_or_default().to_owned()),
        Some(v) => Some(" ".repeat(v.as_usize().ok_or_else(|| bad("tojson: indent must be an integer or a string"))?)),
    };
    if o.indent.is_some() {
        o.separators.0 = ",".into();
    }
    if let Some(seps) = kwargs.get::<Option<Value>>("separators")?.filter(|v| !v.is_none()) {
        let item = seps.get_item_by_index(0)?;
        let key = seps.get_item_by_index(1)?;
        match (item.as_str(), key.as_str()) {
            (Some(i), Some(k)) => o.separators = (i.to_owned(), k.to_owned()),
            _ => return Err(bad("tojson: separators must be two strings")),
        }
    }
    kwargs.assert_all_used()?;
    let mut out = String::new();
    dump(value, &o, 0, &mut out)?;
    Ok(Value::from_safe_string(out))
}

fn bad(msg: &str) -> Error {
    Error::new(ErrorKind::InvalidOperation, msg.to_owned())
}

/// Writes `value` as `json.dumps` would.
pub fn dump(value: &Value, o: &DumpOptions, depth: usize, out: &mut String) -> Result<(), Error> {
    match value.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => out.push_str(&number(value, true)),
        ValueKind::String => quote_json(value.as_str().unwrap_or_default(), o.ensure_ascii, out),
        ValueKind::Map => {
            let mut keys: Vec<Value> = value.try_iter()?.collect();
            if o.sort_keys {
                keys.sort();
            }
            container(o, depth, ('{', '}'), keys.len(), out, |i, out| {
                let k = &keys[i];
                let key = match k.kind() {
                    ValueKind::String => k.as_str().unwrap_or_default().to_owned(),
                    ValueKind::Bool | ValueKind::None | ValueKind::Number => {
                        let mut s = String::new();
                        dump(k, o, 0, &mut s)?;
                        s
                    }
                    _ => return Err(bad("tojson: object keys must be strings, numbers, booleans or null")),
                };
                quote_json(&key, o.ensure_ascii, out);
                out.push_str(&o.separators.1);
                dump(&value.get_item(k)?, o, depth + 1, out)
            })?;
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            container(o, depth, ('[', ']'), items.len(), out, |i, out| dump(&items[i], o, depth + 1, out))?;
        }
        _ => return Err(bad(&format!("tojson: a {} cannot be written as JSON", value.kind()))),
    }
    Ok(())
}

/// A JSON object or array of `n` items: `{}`/`[]` when empty, else the items between the
/// brackets, separated (and indented) as `o` says.
fn container(
    o: &DumpOptions,
    depth: usize,
    (open, shut): (char, char),
    n: usize,
    out: &mut String,
    mut item: impl FnMut(usize, &mut String) -> Result<(), Error>,
) -> Result<(), Error> {
    out.push(open);
    if n > 0 {
        for i in 0..n {
            separator(o, depth + 1, i == 0, out);
            item(i, out)?;
        }
        close(o, depth, out);
    }
    out.push(shut);
    Ok(())
}

fn separator(o: &DumpOptions, depth: usize, first: bool, out: &mut String) {
    if !first {
        out.push_str(&o.separators.0);
    }
    if let Some(ind) = &o.indent {
        out.push('\n');
        out.push_str(&ind.repeat(depth));
    }
}

fn close(o: &DumpOptions, depth: usize, out: &mut String) {
    if let Some(ind) = &o.indent {
        out.push('\n');
        out.push_str(&ind.repeat(depth));
    }
}

/// A JSON string literal as Python writes it (`\uXXXX` in lower-case hex).
fn quote_json(s: &str, ensure_ascii: bool, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ensure_ascii && (c as u32) > 0x7e) => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// A number as Python prints it: integers as they are, floats by `repr` (`2.5`, `1.0`,
/// `1e-05`, `1e+16`); `json` spells the non-finite ones `NaN`/`Infinity`.
fn number(value: &Value, json: bool) -> String {
    if value.is_integer() {
        return value.to_string();
    }
    let x = f64::try_from(value.clone()).unwrap_or(f64::NAN);
    match (x.is_nan(), x.is_infinite(), json) {
        (true, _, true) => "NaN".into(),
        (true, _, false) => "nan".into(),
        (_, true, true) => if x > 0.0 { "Infinity" } else { "-Infinity" }.into(),
        (_, true, false) => if x > 0.0 { "inf" } else { "-inf" }.into(),
        _ => float_repr(x),
    }
}

/// Python's `repr(float)`: the shortest round-tripping digits, fixed notation for exponents in
/// [-4, 16), scientific (`1.5e+20`, `1e-05`) outside.
pub fn float_repr(x: f64) -> String {
    let sci = format!("{x:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (sign, mantissa) = mantissa.strip_prefix('-').map_or(("", mantissa), |m| ("-", m));
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    if (-4..16).contains(&exp) {
        let body = if exp >= 0 {
            let e = exp as usize;
            let int = if digits.len() > e { digits[..=e].to_owned() } else { format!("{digits}{}", "0".repeat(e + 1 - digits.len())) };
            let frac = if digits.len() > e + 1 { &digits[e + 1..] } else { "0" };
            format!("{int}.{frac}")
        } else {
            format!("0.{}{digits}", "0".repeat((-exp - 1) as usize))
        };
        format!("{sign}{body}")
    } else {
        let m = if digits.len() > 1 { format!("{}.{}", &digits[..1], &digits[1..]) } else { digits };
        format!("{sign}{m}e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs())
    }
}

/// Python's `str(value)`: what `{{ value }}` and the `string` filter print in Jinja2.
pub fn py_str(value: &Value) -> String {
    match value.kind() {
        ValueKind::Undefined => String::new(),
        ValueKind::String => value.as_str().unwrap_or_default().to_owned(),
        _ => py_repr(value),
    }
}

/// Python's `repr(value)`: `'text'`, `True`, `None`, `{'a': [1, 2.5]}`.
pub fn py_repr(value: &Value) -> String {
    match value.kind() {
        ValueKind::Undefined => String::new(),
        ValueKind::None => "None".into(),
        ValueKind::Bool => if value.is_true() { "True" } else { "False" }.into(),
        ValueKind::Number => number(value, false),
        ValueKind::String => quote_py(value.as_str().unwrap_or_default()),
        ValueKind::Map => {
            let keys: Vec<Value> = value.try_iter().map(Iterator::collect).unwrap_or_default();
            let items: Vec<String> =
                keys.iter().map(|k| format!("{}: {}", py_repr(k), py_repr(&value.get_item(k).unwrap_or_default()))).collect();
            format!("{{{}}}", items.join(", "))
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<String> = value.try_iter().map(|it| it.map(|v| py_repr(&v)).collect()).unwrap_or_default();
            format!("[{}]", items.join(", "))
        }
        _ => value.to_string(),
    }
}

/// A Python string literal: single quotes unless the text has one and no double quote.
fn quote_py(s: &str) -> String {
    let q = if s.contains('\'') && !s.contains('"') { '"' } else { '\'' };
    let mut out = String::from(q);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == q => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push(q);
    out
}

/// JSON text with Python's `json.dumps` separators (`, ` and `: `), as vLLM's arguments read.
pub fn python_style(v: &serde_json::Value) -> String {
    use serde_json::Value;
    match v {
        Value::Object(m) => {
            let items: Vec<String> = m.iter().map(|(k, v)| format!("{}: {}", Value::String(k.clone()), python_style(v))).collect();
            format!("{{{}}}", items.join(", "))
        }
        Value::Array(a) => format!("[{}]", a.iter().map(python_style).collect::<Vec<_>>().join(", ")),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_print_as_python_repr() {
        // Expected values are Python 3's repr() of the same floats.
        let cases = [
            (2.5, "2.5"),
            (1.0, "1.0"),
            (1e-05, "1e-05"),
            (0.0001, "0.0001"),
            (1e16, "1e+16"),
            (1.5e20, "1.5e+20"),
            (123456789012345.6, "123456789012345.6"),
            (-0.5, "-0.5"),
            (0.1 + 0.2, "0.30000000000000004"),
            (1e100, "1e+100"),
            (100.0, "100.0"),
        ];
        for (x, want) in cases {
            assert_eq!(float_repr(x), want, "{x}");
        }
    }

    #[test]
    fn values_print_as_python_str_and_repr() {
        let v = Value::from_serialize(serde_json::json!({"a": [1, 2.5, true, null], "b": "it's"}));
        assert_eq!(py_repr(&v), r#"{'a': [1, 2.5, True, None], 'b': "it's"}"#);
        assert_eq!(py_str(&Value::from(false)), "False");
        assert_eq!(py_str(&Value::from("x")), "x");
    }

    #[test]
    fn json_dumps_escapes_as_python_does() {
        let v = Value::from_serialize(serde_json::json!({"t": "é\u{1b}\"<&>", "n": [], "o": {}}));
        let mut s = String::new();
        dump(&v, &DumpOptions::default(), 0, &mut s).unwrap();
        assert_eq!(s, "{\"t\": \"é\\u001b\\\"<&>\", \"n\": [], \"o\": {}}");
        let mut s = String::new();
        dump(
            &v,
            &DumpOptions { ensure_ascii: true, indent: Some("  ".into()), separators: (",".into(), ": ".into()), sort_keys: true },
            0,
            &mut s,
        )
        .unwrap();
        assert_eq!(s, "{\n  \"n\": [],\n  \"o\": {},\n  \"t\": \"\\u00e9\\u001b\\\"<&>\"\n}");
    }
}

//! `tokenizer.json` via the tokenizers crate, with bos/eos/add_bos and the chat template from
//! `tokenizer_config.json` and `generation_config.json`; long prompts go through a cache of
//! segments ([`segments`]).

mod segments;

use std::path::Path;
use std::str::FromStr;

use serde_json::Value;

use crate::config::ids_of;
use crate::error::{EngineError, Result};
pub use segments::{SegmentStats, DEFAULT_CACHE_BYTES};

/// A checkpoint's tokenizer and its special-token conventions.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// BOS id, if the model has one.
    pub bos_token_id: Option<u32>,
    /// Every id that ends generation.
    pub eos_token_ids: Vec<u32>,
    /// Whether prompts start with BOS.
    pub add_bos_token: bool,
    /// The Jinja chat template, if the checkpoint ships one.
    pub chat_template: Option<String>,
    /// BOS text (for chat templates).
    pub bos_token: Option<String>,
    /// EOS text (for chat templates).
    pub eos_token: Option<String>,
    /// The longest token's text in UTF-8 bytes (see [`Self::max_token_bytes`]), found at load.
    max_token_bytes: usize,
    /// Segments long prompts and caches their ids, where this tokenizer allows it.
    segments: Option<segments::Segmenter>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab", &self.vocab_size())
            .field("bos", &self.bos_token_id)
            .field("eos", &self.eos_token_ids)
            .finish()
    }
}

fn read_json(path: &Path) -> Result<Option<Value>> {
    if !path.exists() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(path).map_err(|e| EngineError::Io { path: path.into(), message: e.to_string() })?;
    serde_json::from_str(&text).map(Some).map_err(|e| EngineError::Io { path: path.into(), message: e.to_string() })
}

/// A special token in `tokenizer_config.json`: a string or `{"content": ...}`.
fn token_text(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content").and_then(Value::as_str).map(str::to_owned),
        _ => None,
    }
}

impl Tokenizer {
    /// Loads the tokenizer files of a checkpoint directory; `config_eos` / `config_bos` come
    /// from `config.json` and are used when the tokenizer files say nothing.
    pub fn from_dir(dir: &Path, config_bos: Option<u32>, config_eos: &[u32]) -> Result<Self> {
        let path = dir.join("tokenizer.json");
        let text = std::fs::read_to_string(&path).map_err(|e| EngineError::Io { path: path.clone(), message: e.to_string() })?;
        let inner = tokenizers::Tokenizer::from_str(&text).map_err(|e| EngineError::Tokenizer(format!("{}: {e}", path.display())))?;
        let json: Value = serde_json::from_str(&text).map_err(|e| EngineError::Io { path: path.clone(), message: e.to_string() })?;
        let segments = match segments::Segmenter::new(&json, &inner) {
            Ok(s) => Some(s),
            Err(why) => {
                tracing::info!(%why, "long prompts are tokenized whole (no segment cache)");
                None
            }
        };
        let tc = read_json(&dir.join("tokenizer_config.json"))?.unwrap_or(Value::Null);
        let gc = read_json(&dir.join("generation_config.json"))?.unwrap_or(Value::Null);
        let bos_token = token_text(tc.get("bos_token"));
        let eos_token = token_text(tc.get("eos_token"));
        let bos_token_id = gc
            .get("bos_token_id")
            .and_then(Value::as_u64)
            .map(|x| x as u32)
            .or_else(|| bos_token.as_deref().and_then(|t| inner.token_to_id(t)))
            .or(config_bos);
        let mut eos_token_ids = ids_of(gc.get("eos_token_id"));
        if eos_token_ids.is_empty() {
            eos_token_ids = eos_token.as_deref().and_then(|t| inner.token_to_id(t)).map(|id| vec![id]).unwrap_or_default();
        }
        if eos_token_ids.is_empty() {
            eos_token_ids = config_eos.to_vec();
        }
        let add_bos_token = tc.get("add_bos_token").and_then(Value::as_bool).unwrap_or(false);
        let chat_template = match tc.get("chat_template") {
            Some(Value::String(s)) => Some(s.clone()),
            // A list of named templates: take `default`, else the first.
            Some(Value::Array(a)) => a
                .iter()
                .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
                .or_else(|| a.first())
                .and_then(|t| t.get("template"))
                .and_then(Value::as_str)
                .map(str::to_owned),
            _ => None,
        };
        // Newer checkpoints (Qwen3.5) ship the template as its own file.
        let chat_template = match chat_template {
            Some(t) => Some(t),
            None => {
                let path = dir.join("chat_template.jinja");
                match std::fs::read_to_string(&path) {
                    Ok(t) => Some(t),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                    Err(e) => return Err(EngineError::Io { path, message: e.to_string() }),
                }
            }
        };
        let max_token_bytes = inner.get_vocab(true).keys().map(String::len).max().unwrap_or(1).max(1);
        Ok(Self { inner, bos_token_id, eos_token_ids, add_bos_token, chat_template, bos_token, eos_token, max_token_bytes, segments })
    }

    /// The tokenizer as `tokenizer.json` text (for libraries that build their own view of it,
    /// such as the structured-output grammar engine).
    pub fn to_json(&self) -> Result<String> {
        self.inner.to_string(false).map_err(|e| EngineError::Tokenizer(e.to_string()))
    }

    /// Vocabulary size including added tokens.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The longest token's text in UTF-8 bytes: an upper bound on the input bytes one token
    /// covers (byte-level and SentencePiece vocabularies spell a byte with one to three UTF-8
    /// bytes). So a text of B bytes needs at least B / this many tokens, known without
    /// tokenizing it (normalisers that shrink text aside, which is why callers allow a margin).
    pub fn max_token_bytes(&self) -> usize {
        self.max_token_bytes
    }

    /// Tokenizes a prompt; BOS is prepended once when `add_bos_token` asks for it (the
    /// tokenizer's own post-processor may already have added it).
    /// Texts of a few hundred bytes or more are cut at seams and their segments' ids cached, with
    /// the same result as tokenizing them whole.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        let err = |e: tokenizers::Error| EngineError::Tokenizer(e.to_string());
        let cached = match &self.segments {
            Some(s) => s.encode(&self.inner, text, add_special_tokens).map_err(err)?,
            None => None,
        };
        let mut ids = match cached {
            Some(ids) => ids,
            None => self.inner.encode_fast(text, add_special_tokens).map_err(err)?.get_ids().to_vec(),
        };
        if add_special_tokens && self.add_bos_token {
            if let Some(bos) = self.bos_token_id {
                if ids.first() != Some(&bos) {
                    ids.insert(0, bos);
                }
            }
        }
        Ok(ids)
    }

    /// Sets the segment cache's budget in bytes of text plus ids (0: every prompt is tokenized
    /// whole); [`DEFAULT_CACHE_BYTES`] at load.
    pub fn set_segment_cache_bytes(&self, bytes: usize) {
        if let Some(s) = &self.segments {
            s.set_budget(bytes);
        }
    }

    /// The segment cache's counters, or `None` where this tokenizer cannot be cut safely.
    pub fn segment_stats(&self) -> Option<SegmentStats> {
        self.segments.as_ref().map(segments::Segmenter::stats)
    }

    /// Turns ids back into text.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        self.inner.decode(ids, skip_special_tokens).map_err(|e| EngineError::Tokenizer(e.to_string()))
    }

    /// The text of one token id, if it exists.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }
}

/// Streams text for a growing list of ids without splitting multi-byte characters: text is
/// released only once it no longer ends in a replacement character.
#[derive(Debug, Default, Clone)]
pub struct IncrementalDecoder {
    ids: Vec<u32>,
    prefix_offset: usize,
    read_offset: usize,
}

impl IncrementalDecoder {
    /// Starts after `context` (ids whose text is already known, e.g. the prompt tail).
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one id and returns the newly completed text, if any.
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> Result<Option<String>> {
        self.ids.push(id);
        let prefix = tok.decode(&self.ids[self.prefix_offset..self.read_offset], true)?;
        let full = tok.decode(&self.ids[self.prefix_offset..], true)?;
        if full.len() > prefix.len() && !full.ends_with('\u{FFFD}') && full.is_char_boundary(prefix.len()) {
            let new = full[prefix.len()..].to_owned();
            self.prefix_offset = self.read_offset;
            self.read_offset = self.ids.len();
            Ok(Some(new))
        } else {
            Ok(None)
        }
    }

    /// Text held back so far (an incomplete character at the end of generation).
    pub fn flush(&mut self, tok: &Tokenizer) -> Result<Option<String>> {
        let prefix = tok.decode(&self.ids[self.prefix_offset..self.read_offset], true)?;
        let full = tok.decode(&self.ids[self.prefix_offset..], true)?;
        self.prefix_offset = self.ids.len();
        self.read_offset = self.ids.len();
        Ok((full.len() > prefix.len() && full.is_char_boundary(prefix.len())).then(|| full[prefix.len()..].to_owned()))
    }
}

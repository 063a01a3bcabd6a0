//! Long prompts tokenized in segments, each segment's ids cached by its text.
//!
//! A chat turn re-sends the whole conversation, and tokenizing a few thousand tokens again costs
//! milliseconds (mostly the pre-tokenizer's regex). A segment ends at a *seam*: a place where the
//! tokenizer provably starts afresh, so that tokenizing the segments one by one gives exactly the
//! ids of tokenizing the text whole. Only segments not seen before are tokenized.
//!
//! Two kinds of seam, each allowed only where the tokenizer's configuration guarantees it:
//! - **Before an added token** (`<|im_start|>`, `</s>`): the tokenizer splits the text at added
//!   tokens before normalizing or pre-tokenizing it, so the pieces are independent. Needs no added
//!   token that strips the whitespace on its left or must stand alone as a word (both look across
//!   the seam); the segment after the seam starts with the token, so a pre-tokenizer that treats
//!   the text's start specially (Metaspace "first") sees no start there either.
//! - **After a line break** between two non-space characters (`…:\n#`, `…)\n<`): for the GPT-2
//!   byte-level regex and the Llama 3 / Qwen 2 split regexes every piece ends there, and no piece
//!   before it looks past it (their one lookahead, `\s+(?!\S)`, cannot end at a character that
//!   follows a non-space). Needs one of those pre-tokenizers without a prefix space, a normalizer
//!   that is absent or NFC/NFKC, and no added token containing a line break.
//!
//! A load-time self-check compares the segmented ids with whole-text ids on a probe text and
//! turns segmenting off if they differ.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use aho_corasick::{AhoCorasick, MatchKind};
use lru::LruCache;
use serde_json::Value;

/// Cache budget a tokenizer starts with, in bytes of segment text plus ids.
pub const DEFAULT_CACHE_BYTES: usize = 32 << 20;
/// Seams closer than this to the previous cut are skipped: segments of a few hundred bytes keep
/// the cache's entries few while a new chat turn re-tokenizes at most one of them needlessly.
const MIN_SEGMENT_BYTES: usize = 256;
/// Texts shorter than this are tokenized whole.
pub(crate) const MIN_TEXT_BYTES: usize = 2 * MIN_SEGMENT_BYTES;

/// The Llama 3 split regex (digits in groups of three).
const LLAMA3_REGEX: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// The Qwen 2 split regex (one digit a piece), also Qwen3-Next's and Qwen3.5's.
const QWEN2_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Bytes of segment text and ids hit and missed so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SegmentStats {
    /// Text bytes whose ids came from the cache.
    pub hit_bytes: u64,
    /// Text bytes tokenized.
    pub miss_bytes: u64,
    /// Segments held now.
    pub entries: usize,
}

/// Where a tokenizer may be cut, and the cache of segments' ids.
pub(crate) struct Segmenter {
    /// Every added token matched on the raw text, leftmost-longest as the tokenizer matches them.
    added: Option<AhoCorasick>,
    /// Line-break seams are sound for this tokenizer.
    newline: bool,
    /// Ids the post-processor puts before and after one sequence (BOS, EOS), when it does only
    /// that; `None` sends texts asking for special tokens to the whole-text path.
    wrap: Option<(Vec<u32>, Vec<u32>)>,
    cache: Mutex<Cache>,
    hit_bytes: AtomicU64,
    miss_bytes: AtomicU64,
}

struct Cache {
    lru: LruCache<Box<str>, Arc<[u32]>>,
    bytes: usize,
    budget: usize,
}

impl Cache {
    fn cost(text: &str, ids: &[u32]) -> usize {
        text.len() + 4 * ids.len() + 64
    }

    fn shrink_to(&mut self, budget: usize) {
        while self.bytes > budget {
            let Some((k, v)) = self.lru.pop_lru() else { break };
            self.bytes -= Self::cost(&k, &v);
        }
    }
}

fn is_false(v: Option<&Value>) -> bool {
    !v.and_then(Value::as_bool).unwrap_or(false)
}

/// The GPT-2 byte-level pre-tokenizer (its regex built in), or a known split regex followed by a
/// byte-level mapping without a regex; never a prefix space.
fn newline_seams_sound(pre: &Value) -> bool {
    let byte_level = |v: &Value, regex: bool| {
        v.get("type").and_then(Value::as_str) == Some("ByteLevel")
            && is_false(v.get("add_prefix_space"))
            && v.get("use_regex").and_then(Value::as_bool).unwrap_or(true) == regex
    };
    if byte_level(pre, true) {
        return true;
    }
    let Some([split, bytes]) = pre.get("pretokenizers").and_then(Value::as_array).map(Vec::as_slice) else { return false };
    pre.get("type").and_then(Value::as_str) == Some("Sequence")
        && split.get("type").and_then(Value::as_str) == Some("Split")
        && split.pointer("/pattern/Regex").and_then(Value::as_str).is_some_and(|r| r == LLAMA3_REGEX || r == QWEN2_REGEX)
        && split.get("behavior").and_then(Value::as_str) == Some("Isolated")
        && is_false(split.get("invert"))
        && byte_level(bytes, false)
}

/// No normalizer, or only canonical/compatibility composition (which never joins a character
/// to a line break before it).
fn normalizer_local(norm: &Value) -> bool {
    match norm.get("type").and_then(Value::as_str) {
        None => norm.is_null(),
        Some("NFC" | "NFKC") => true,
        Some("Sequence") => norm.get("normalizers").and_then(Value::as_array).is_some_and(|n| n.iter().all(normalizer_local)),
        _ => false,
    }
}

impl Segmenter {
    /// Reads what `tokenizer.json` allows; `Err` says why segmenting is off for this tokenizer.
    pub(crate) fn new(json: &Value, inner: &tokenizers::Tokenizer) -> Result<Self, String> {
        for field in ["truncation", "padding"] {
            if json.get(field).is_some_and(|v| !v.is_null()) {
                return Err(format!("tokenizer.json sets `{field}`"));
            }
        }
        let added = json.get("added_tokens").and_then(Value::as_array).cloned().unwrap_or_default();
        if let Some(t) = added.iter().find(|t| !is_false(t.get("lstrip")) || !is_false(t.get("single_word"))) {
            return Err(format!("added token {} strips left or is single-word", t.get("content").unwrap_or(&Value::Null)));
        }
        let contents = |normalized: bool| {
            added
                .iter()
                .filter(move |t| t.get("normalized").and_then(Value::as_bool).unwrap_or(false) == normalized)
                .filter_map(|t| t.get("content").and_then(Value::as_str))
                .filter(|c| !c.is_empty())
        };
        let raw: Vec<&str> = contents(false).collect();
        let newline = newline_seams_sound(json.get("pre_tokenizer").unwrap_or(&Value::Null))
            && normalizer_local(json.get("normalizer").unwrap_or(&Value::Null))
            && !raw.iter().chain(contents(true).collect::<Vec<_>>().iter()).any(|c| c.contains(['\n', '\r']));
        let added = match raw.is_empty() {
            true => None,
            false => {
                Some(AhoCorasick::builder().match_kind(MatchKind::LeftmostLongest).build(&raw).map_err(|e| format!("added tokens: {e}"))?)
            }
        };
        if added.is_none() && !newline {
            return Err("no added tokens and a pre-tokenizer without known line-break seams".into());
        }
        let seg = Self {
            added,
            newline,
            wrap: None,
            cache: Mutex::new(Cache { lru: LruCache::unbounded(), bytes: 0, budget: DEFAULT_CACHE_BYTES }),
            hit_bytes: AtomicU64::new(0),
            miss_bytes: AtomicU64::new(0),
        };
        let wrap = seg.find_wrap(inner);
        let seg = Self { wrap, ..seg };
        seg.self_check(inner, json)?;
        Ok(seg)
    }

    /// The ids `encode(x, true)` adds around `encode(x, false)`, if they are the same for two
    /// different texts.
    fn find_wrap(&self, inner: &tokenizers::Tokenizer) -> Option<(Vec<u32>, Vec<u32>)> {
        let mut found: Option<(Vec<u32>, Vec<u32>)> = None;
        for probe in ["Hello world", "x = 1\n\ny = 22"] {
            let raw = inner.encode_fast(probe, false).ok()?.get_ids().to_vec();
            let full = inner.encode_fast(probe, true).ok()?.get_ids().to_vec();
            let at = (0..=full.len().checked_sub(raw.len())?).find(|&i| full[i..i + raw.len()] == raw[..])?;
            let this = (full[..at].to_vec(), full[at + raw.len()..].to_vec());
            if found.as_ref().is_some_and(|f| *f != this) {
                return None;
            }
            found = Some(this);
        }
        found
    }

    /// Segmented and whole ids of a probe text must agree, cutting at every seam.
    fn self_check(&self, inner: &tokenizers::Tokenizer, json: &Value) -> Result<(), String> {
        let mut probe = String::from("Hello world!\n#  Title:\n\nsome  text, don't  stop\n  indented\tline\n12345 x\n");
        probe.push_str("é日本語 café\r\nnext\n\n\nthree\n \nspace\n.\n:\n'll\n");
        let added = json.get("added_tokens").and_then(Value::as_array).cloned().unwrap_or_default();
        for t in added.iter().filter_map(|t| t.get("content").and_then(Value::as_str)).take(16) {
            probe.push_str(&format!("a{t}b\n{t}\n c{t} {t}{t}\nx{t}"));
        }
        let whole = inner.encode_fast(probe.as_str(), false).map_err(|e| e.to_string())?.get_ids().to_vec();
        let mut pieces = Vec::new();
        let mut start = 0;
        for end in self.cuts(&probe, 1) {
            pieces.extend_from_slice(inner.encode_fast(&probe[start..end], false).map_err(|e| e.to_string())?.get_ids());
            start = end;
        }
        if pieces != whole {
            return Err("segmented ids differ from whole-text ids on the self-check probe".into());
        }
        if let Some((before, after)) = &self.wrap {
            let with = inner.encode_fast(probe.as_str(), true).map_err(|e| e.to_string())?.get_ids().to_vec();
            if with != [before.as_slice(), &pieces, after.as_slice()].concat() {
                return Err("the post-processor's special tokens are not the same around every text".into());
            }
        }
        Ok(())
    }

    /// Ends of the segments of `text` (the last is `text.len()`), seams at least `min` bytes apart.
    fn cuts(&self, text: &str, min: usize) -> Vec<usize> {
        let mut seams: Vec<usize> = Vec::new();
        if let Some(ac) = &self.added {
            seams.extend(ac.find_iter(text).map(|m| m.start()));
        }
        if self.newline {
            let b = text.as_bytes();
            for (i, _) in b.iter().enumerate().filter(|(_, &c)| c == b'\n') {
                let before = text[..i].chars().next_back();
                let after = text[i + 1..].chars().next();
                if before.is_some_and(|c| !c.is_whitespace()) && after.is_some_and(|c| !c.is_whitespace()) {
                    seams.push(i + 1);
                }
            }
            seams.sort_unstable();
        }
        let mut cuts = Vec::new();
        let mut last = 0;
        for p in seams {
            if p >= last + min && p < text.len() {
                cuts.push(p);
                last = p;
            }
        }
        cuts.push(text.len());
        cuts
    }

    /// Sets the cache's budget in bytes (text plus ids); 0 turns segmenting off.
    pub(crate) fn set_budget(&self, bytes: usize) {
        let mut c = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        c.budget = bytes;
        c.shrink_to(bytes);
    }

    /// What the cache has done so far.
    pub(crate) fn stats(&self) -> SegmentStats {
        let entries = self.cache.lock().unwrap_or_else(|e| e.into_inner()).lru.len();
        SegmentStats { hit_bytes: self.hit_bytes.load(Ordering::Relaxed), miss_bytes: self.miss_bytes.load(Ordering::Relaxed), entries }
    }

    /// The ids of `text` through the cache, or `None` where this text takes the whole-text path
    /// (short, no seam, special tokens the post-processor adds in some other way, cache off).
    pub(crate) fn encode(&self, inner: &tokenizers::Tokenizer, text: &str, add_special: bool) -> tokenizers::Result<Option<Vec<u32>>> {
        let wrap = match (add_special, &self.wrap) {
            (false, _) => None,
            (true, Some(w)) => Some(w),
            (true, None) => return Ok(None),
        };
        if text.len() < MIN_TEXT_BYTES {
            return Ok(None);
        }
        let cuts = self.cuts(text, MIN_SEGMENT_BYTES);
        if cuts.len() < 2 {
            return Ok(None);
        }
        let segments: Vec<&str> = std::iter::once(0).chain(cuts.iter().copied()).zip(&cuts).map(|(a, b)| &text[a..*b]).collect();
        let mut found: Vec<Option<Arc<[u32]>>> = {
            let mut c = self.cache.lock().unwrap_or_else(|e| e.into_inner());
            if c.budget == 0 {
                return Ok(None);
            }
            segments.iter().map(|s| c.lru.get(*s).cloned()).collect()
        };
        let mut fresh = Vec::new();
        for (s, ids) in segments.iter().zip(found.iter_mut()) {
            if ids.is_none() {
                let new: Arc<[u32]> = inner.encode_fast(*s, false)?.get_ids().into();
                fresh.push((*s, new.clone()));
                *ids = Some(new);
            }
        }
        let missed: usize = fresh.iter().map(|(s, _)| s.len()).sum();
        self.miss_bytes.fetch_add(missed as u64, Ordering::Relaxed);
        self.hit_bytes.fetch_add((text.len() - missed) as u64, Ordering::Relaxed);
        if !fresh.is_empty() {
            let mut c = self.cache.lock().unwrap_or_else(|e| e.into_inner());
            for (s, ids) in fresh {
                let cost = Cache::cost(s, &ids);
                if cost <= c.budget {
                    if let Some(old) = c.lru.put(s.into(), ids) {
                        c.bytes -= Cache::cost(s, &old);
                    }
                    c.bytes += cost;
                }
            }
            let budget = c.budget;
            c.shrink_to(budget);
        }
        let mut ids = Vec::with_capacity(found.iter().flatten().map(|s| s.len()).sum::<usize>() + 4);
        if let Some((before, _)) = wrap {
            ids.extend_from_slice(before);
        }
        for s in found.iter().flatten() {
            ids.extend_from_slice(s);
        }
        if let Some((_, after)) = wrap {
            ids.extend_from_slice(after);
        }
        Ok(Some(ids))
    }
}

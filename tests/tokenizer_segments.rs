//! The segment cache of long prompts gives exactly the ids the tokenizers library gives for the
//! whole text, for every kind of tokenizer it accepts, and turns itself off for the ones it
//! cannot cut safely. Each variant is the fixtures' byte-level BPE with its pre-tokenizer,
//! normalizer or added tokens changed in `tokenizer.json`; the expected ids come from the
//! tokenizers crate encoding the whole text.

use std::path::Path;

use deltaserve_engine::tokenizer::Tokenizer;
use deltaserve_tests::compact_dir;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

const QWEN2: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// GPT-4o's regex: not one the cache knows, so only added tokens may cut.
const O200K: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The fixtures' tokenizer with a merge, applied first, for every ordered pair of some spaces,
/// punctuation, letters and digits: its 512-token vocabulary alone would give the same ids for
/// many different pre-tokenizations, so a wrong cut could go unseen.
fn base() -> Value {
    let path = compact_dir().join("gdn/tokenizer.json");
    let mut t: Value = serde_json::from_str(&std::fs::read_to_string(&path).expect("fixture tokenizer")).expect("json");
    // Byte-level spellings of ' ', '\n', '\t', '\r', then printable characters as themselves.
    let chars = [
        "\u{120}", "\u{10a}", "\u{109}", "\u{10d}", ":", "#", "(", ")", "'", ".", "<", ">", "|", "a", "s", "l", "L", "d", "x", "e", "1",
        "2", "3",
    ];
    let old = t["model"]["merges"].as_array().cloned().expect("merges");
    let vocab = t["model"]["vocab"].as_object_mut().expect("vocab");
    let mut next = vocab.values().filter_map(Value::as_u64).max().expect("ids") + 1;
    let mut merges = Vec::new();
    for a in chars {
        for b in chars {
            let joined = format!("{a}{b}");
            if !vocab.contains_key(&joined) {
                vocab.insert(joined, json!(next));
                next += 1;
            }
            merges.push(json!([a, b]));
        }
    }
    let kept: Vec<Value> = old.into_iter().filter(|m| !merges.contains(m)).collect();
    merges.extend(kept);
    t["model"]["merges"] = Value::Array(merges);
    t
}

fn split_then_bytes(regex: &str) -> Value {
    json!({"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": false},
        {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false}]})
}

fn add_tokens(t: &mut Value, tokens: &[(&str, bool)]) {
    let added = t["added_tokens"].as_array_mut().expect("added_tokens");
    for (id, (content, lstrip)) in (100_000..).zip(tokens) {
        added.push(json!({"id": id, "content": content, "single_word": false, "lstrip": lstrip, "rstrip": false, "normalized": false, "special": true}));
    }
}

struct Variant {
    name: &'static str,
    json: Value,
    /// Whether the cache should accept this tokenizer.
    cached: bool,
}

fn variants() -> Vec<Variant> {
    let chat = [("<|im_start|>", false), ("<|im_end|>", false)];
    let mut v = Vec::new();
    v.push(Variant { name: "gpt2 byte-level", json: base(), cached: true });
    let mut t = base();
    t["pre_tokenizer"] = split_then_bytes(QWEN2);
    t["normalizer"] = json!({"type": "NFC"});
    add_tokens(&mut t, &chat);
    v.push(Variant { name: "qwen2 regex, NFC, chat tokens", json: t, cached: true });
    let mut t = base();
    t["pre_tokenizer"] = split_then_bytes(LLAMA3);
    add_tokens(&mut t, &chat);
    v.push(Variant { name: "llama3 regex", json: t, cached: true });
    let mut t = base();
    t["pre_tokenizer"] = split_then_bytes(O200K);
    add_tokens(&mut t, &chat);
    v.push(Variant { name: "o200k regex (added-token seams only)", json: t, cached: true });
    let mut t = base();
    t["pre_tokenizer"] = json!({"type": "Metaspace", "replacement": "\u{2581}", "prepend_scheme": "first", "split": true});
    t["model"]["unk_token"] = json!("<unk>");
    add_tokens(&mut t, &chat);
    v.push(Variant { name: "metaspace first (added-token seams only)", json: t, cached: true });
    let mut t = base();
    t["pre_tokenizer"]["add_prefix_space"] = json!(true);
    v.push(Variant { name: "byte-level with a prefix space (added-token seams only)", json: t, cached: true });
    let mut t = base();
    add_tokens(&mut t, &[("<mask>", true)]);
    v.push(Variant { name: "an added token stripping left", json: t, cached: false });
    let mut t = base();
    t["truncation"] = json!({"direction": "Right", "max_length": 4096, "strategy": "LongestFirst", "stride": 0});
    v.push(Variant { name: "truncation set", json: t, cached: false });
    v
}

fn load(dir: &Path, json: &Value) -> (Tokenizer, tokenizers::Tokenizer) {
    let path = dir.join("tokenizer.json");
    std::fs::write(&path, serde_json::to_string(json).expect("json")).expect("write");
    let ours = Tokenizer::from_dir(dir, None, &[]).expect("our tokenizer");
    let reference = tokenizers::Tokenizer::from_file(&path).expect("reference tokenizer");
    (ours, reference)
}

const PIECES: &[&str] = &[
    "Hello",
    " world",
    "\n",
    "\n\n",
    "\n\n\n",
    " ",
    "  ",
    "\t",
    "\r\n",
    "don't",
    "'s",
    "'LL",
    "12345",
    "3.14",
    "é",
    "e\u{301}",
    "日本語",
    "😀",
    ":",
    "#",
    "(",
    ")",
    "    return a + b",
    "<s>",
    "</s>",
    "<unk>",
    "<|im_start|>",
    "<|im_end|>",
    "user",
    "assistant",
    "\n#",
    ":\n",
    "x",
    "\u{a0}",
    " \n",
    "\n ",
    "Ω",
    "def add(a, b):",
    "# user:\n",
    "<|im_start|>assistant\n",
    "<|im_end|>\n",
];

fn random_text(rng: &mut StdRng, bytes: usize) -> String {
    let mut s = String::new();
    while s.len() < bytes {
        s.push_str(PIECES[rng.random_range(0..PIECES.len())]);
    }
    s
}

fn ids(r: &tokenizers::Tokenizer, text: &str, special: bool) -> Vec<u32> {
    r.encode(text, special).expect("reference encode").get_ids().to_vec()
}

#[test]
fn segmented_ids_equal_whole_text_ids_for_every_tokenizer_kind() {
    let mut rng = StdRng::seed_from_u64(7);
    for v in variants() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (ours, reference) = load(dir.path(), &v.json);
        assert_eq!(ours.segment_stats().is_some(), v.cached, "{}: segment cache accepted", v.name);
        for round in 0..60 {
            let text = random_text(&mut rng, 600 + 60 * round);
            for special in [false, true] {
                // Twice: the second time every segment comes from the cache.
                for pass in 0..2 {
                    assert_eq!(
                        ours.encode(&text, special).expect("encode"),
                        ids(&reference, &text, special),
                        "{}: round {round} special {special} pass {pass}: {text:?}",
                        v.name
                    );
                }
            }
        }
        if let Some(s) = ours.segment_stats() {
            assert!(s.hit_bytes > 0 && s.miss_bytes > 0 && s.entries > 0, "{}: the cache was not used: {s:?}", v.name);
        }
    }
}

/// A conversation re-sent turn after turn: after the first turn, only the new tail is tokenized.
#[test]
fn a_growing_conversation_tokenizes_only_its_tail() {
    let system = format!("You are a careful Python assistant. {}", "Answer with code:\ndef add(a, b):\n    return a + b\n\n".repeat(125));
    for v in variants().into_iter().filter(|v| v.cached) {
        let dir = tempfile::tempdir().expect("tempdir");
        let (ours, reference) = load(dir.path(), &v.json);
        let chat = v.name.contains("chat") || v.name.contains("regex") || v.name.contains("metaspace");
        let (open, close) = if chat { ("<|im_start|>", "<|im_end|>\n") } else { ("# ", "\n") };
        let mut text = format!("<s>{open}system\n{system}{close}");
        let mut before = ours.segment_stats().expect("cache on");
        for turn in 0..5 {
            text.push_str(&format!(
                "{open}user\nConversation 0, question {turn}: write a function that adds {turn} to a number.{close}{open}assistant\n"
            ));
            assert_eq!(ours.encode(&text, false).expect("encode"), ids(&reference, &text, false), "{}: turn {turn}", v.name);
            let now = ours.segment_stats().expect("cache on");
            let tokenized = now.miss_bytes - before.miss_bytes;
            if turn > 0 {
                assert!(tokenized < 1024, "{}: turn {turn} tokenized {tokenized} of {} bytes", v.name, text.len());
            }
            before = now;
            text.push_str(&format!("Here is the code {turn}:\n    def f(x):\n        return x + {turn}{close}"));
        }
    }
}

#[test]
fn a_zero_budget_turns_the_cache_off_and_keeps_the_ids() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (ours, reference) = load(dir.path(), &base());
    ours.set_segment_cache_bytes(0);
    let text = random_text(&mut StdRng::seed_from_u64(3), 4000);
    assert_eq!(ours.encode(&text, true).expect("encode"), ids(&reference, &text, true));
    let s = ours.segment_stats().expect("stats");
    assert_eq!((s.hit_bytes, s.miss_bytes, s.entries), (0, 0, 0));
    // A small budget holds a few segments, never more than it allows.
    ours.set_segment_cache_bytes(4096);
    for _ in 0..3 {
        assert_eq!(ours.encode(&text, false).expect("encode"), ids(&reference, &text, false));
    }
    let s = ours.segment_stats().expect("stats");
    assert!(s.entries > 0 && s.entries < 16, "{s:?}");
}

/// The benchmarks' character tokenizer (`benches/char_tokenizer.py`, which the chat workload
/// uses so that re-sent answers hit the prefix cache as a trained model's do): any ids but the
/// specials, streamed as the server streams them, give a text that encodes back to those ids,
/// alone and after a chat turn's text.
#[test]
fn the_benchmarks_character_tokenizer_gives_back_any_answer_s_ids() {
    let dir = tempfile::tempdir().expect("tempdir");
    let script = deltaserve_tests::tests_dir().join("../benches/char_tokenizer.py");
    let out = std::process::Command::new("python3").arg(&script).arg(dir.path()).output().expect("python3 runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let tok = Tokenizer::from_dir(dir.path(), None, &[]).expect("our tokenizer");
    assert_eq!(tok.vocab_size(), 4096);
    let turn = "<s># user:\nwrite a function that adds 1 to a number\n# assistant:\n";
    let before = tok.encode(turn, false).expect("encode");
    assert_eq!(before[0], 1, "<s> is the special token");
    let mut rng = StdRng::seed_from_u64(9);
    for _ in 0..20 {
        let ids: Vec<u32> = (0..64).map(|_| rng.random_range(3..4096)).collect();
        let mut stream = deltaserve_engine::tokenizer::IncrementalDecoder::new();
        let mut text = String::new();
        for &id in &ids {
            text.extend(stream.push(&tok, id).expect("push"));
        }
        text.extend(stream.flush(&tok).expect("flush"));
        assert_eq!(text.chars().count(), 64, "one character a token: {text:?}");
        assert_eq!(tok.encode(&text, false).expect("encode"), ids);
        assert_eq!(tok.encode(&format!("{turn}{text}"), false).expect("encode"), [before.clone(), ids].concat());
    }
}

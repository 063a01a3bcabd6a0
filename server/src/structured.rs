//! Structured outputs: a grammar (JSON schema, regex, choice list or Lark) compiled by
//! llguidance against the model's tokenizer, and the per-choice [`Constraint`] that masks each
//! step's logits to the tokens the grammar allows and advances past the sampled one.

use deltaserve_engine::Tokenizer;
use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::SimpleVob;
use llguidance::{Matcher, ParserFactory};
use toktrie_hf_tokenizers::ByteTokenizer;

/// A grammar that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum GrammarError {
    /// The tokenizer could not be turned into llguidance's byte-level view.
    #[error("structured outputs are not available for this tokenizer: {0}")]
    Tokenizer(String),
    /// The grammar (schema, regex, Lark) did not compile, or broke a size/time limit.
    #[error("{0}")]
    Invalid(String),
}

/// The grammar compiler for one model's tokenizer, built once at start.
pub struct Grammars {
    factory: ParserFactory,
}

impl std::fmt::Debug for Grammars {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammars").finish_non_exhaustive()
    }
}

impl Grammars {
    /// Builds the token trie of `tok` for a model whose logits have `vocab_size` entries.
    pub fn new(tok: &Tokenizer, vocab_size: usize) -> Result<Self, GrammarError> {
        let bad = |e: &dyn std::fmt::Display| GrammarError::Tokenizer(e.to_string());
        let json = tok.to_json().map_err(|e| bad(&e))?;
        let mut bt = ByteTokenizer::from_json_bytes(json.as_bytes()).map_err(|e| bad(&e))?;
        // set_eos_tokens asserts on ids outside the tokenizer; keep only those inside.
        let n = bt.tokrx_info().vocab_size;
        let eos: Vec<u32> = tok.eos_token_ids.iter().copied().filter(|&t| t < n).collect();
        if !eos.is_empty() {
            bt.set_eos_tokens(&eos);
        }
        let env = bt.into_tok_env(Some(vocab_size.max(n as usize))).map_err(|e| bad(&e))?;
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| bad(&e))?;
        factory.quiet();
        Ok(Self { factory })
    }

    /// Compiles `grammar` into a fresh constraint. Bounded by llguidance's limits (grammar
    /// size, lexer states and fuel), so a huge or pathological schema fails instead of hanging.
    pub fn compile(&self, grammar: TopLevelGrammar) -> Result<Constraint, GrammarError> {
        let parser = self.factory.create_parser(grammar).map_err(|e| GrammarError::Invalid(brief(&e.to_string())))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(GrammarError::Invalid(brief(&e)));
        }
        Ok(Constraint { matcher, mask: None, gate: None })
    }
}

/// The first line of a compiler message, at most 300 characters (llguidance appends its
/// backtrace to the messages of errors it caught as panics).
fn brief(message: &str) -> String {
    let line = message.lines().next().unwrap_or_default();
    match line.char_indices().nth(300) {
        Some((i, _)) => format!("{}…", &line[..i]),
        None => line.to_owned(),
    }
}

/// One choice's grammar state. Cloning gives an independent copy (for `n > 1` choices).
pub struct Constraint {
    matcher: Matcher,
    /// The next step's allowed tokens, computed ahead (see [`Self::prepare`]).
    mask: Option<Result<SimpleVob, String>>,
    /// While set, the output is free until this text appears (see [`Self::wait_for`]).
    gate: Option<Gate>,
}

/// The text that opens a constraint, and the output's tail seen so far.
#[derive(Debug, Clone)]
struct Gate {
    marker: String,
    tail: String,
}

impl Clone for Constraint {
    fn clone(&self) -> Self {
        Self { matcher: self.matcher.deep_clone(), mask: None, gate: self.gate.clone() }
    }
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint").field("stopped", &self.matcher.is_stopped()).finish_non_exhaustive()
    }
}

impl Constraint {
    /// Computes the allowed tokens of the next step, so that the engine thread can do it while
    /// the model's forward pass runs; [`Self::mask`] uses it.
    pub fn prepare(&mut self) {
        if self.mask.is_none() && self.gate.is_none() {
            self.mask = Some(self.matcher.compute_mask().map_err(|e| e.to_string()));
        }
    }

    /// This step's allowed tokens as mask words (32 tokens a word, lowest bit first), for the
    /// batch's draw: `None` while the output is free (waiting for the gate); an error when the
    /// grammar failed or allows nothing.
    pub fn mask(&mut self) -> Result<Option<&[u32]>, String> {
        if self.gate.is_some() {
            return Ok(None);
        }
        self.prepare();
        match self.mask.as_ref() {
            Some(Ok(m)) if m.num_set() > 0 => Ok(Some(m.as_slice())),
            Some(Ok(_)) => Err("the grammar allows no token here".into()),
            Some(Err(e)) => Err(e.clone()),
            None => Err("no mask".into()),
        }
    }

    /// Advances past the sampled `token`.
    pub fn accept(&mut self, token: u32) -> Result<(), String> {
        self.mask = None;
        if self.gate.is_some() {
            return Ok(());
        }
        self.matcher.consume_token(token).map_err(|e| e.to_string())
    }

    /// Whether the grammar is complete and allows nothing more.
    pub fn is_stopped(&self) -> bool {
        self.gate.is_none() && self.matcher.is_stopped()
    }

    /// Leaves the output free until `marker` has been generated (the end of a reasoning block),
    /// and constrains what follows it.
    pub fn wait_for(&mut self, marker: &str) {
        self.gate = Some(Gate { marker: marker.to_owned(), tail: String::new() });
    }

    /// Whether the constraint still waits for its marker.
    pub fn waiting(&self) -> bool {
        self.gate.is_some()
    }

    /// Takes in the text of the token just generated; opens the gate once its marker appears.
    pub fn observe(&mut self, text: &str) {
        let Some(g) = self.gate.as_mut() else { return };
        g.tail.push_str(text);
        if g.tail.contains(&g.marker) {
            self.gate = None;
            return;
        }
        // Only a tail shorter than the marker can still be part of it.
        let keep = g.marker.len().saturating_sub(1);
        if g.tail.len() > keep {
            let cut = (g.tail.len() - keep..=g.tail.len()).find(|&i| g.tail.is_char_boundary(i)).unwrap_or(g.tail.len());
            g.tail.drain(..cut);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grammars() -> (Tokenizer, Grammars) {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/compact/gdn");
        let tok = Tokenizer::from_dir(&dir, Some(1), &[2]).unwrap();
        let g = Grammars::new(&tok, tok.vocab_size()).unwrap();
        (tok, g)
    }

    #[test]
    fn a_gated_constraint_is_free_until_its_marker_then_masks() {
        let (tok, g) = grammars();
        let mut c = g.compile(TopLevelGrammar::from_regex("yes|no")).unwrap();
        c.wait_for("</think>");
        assert_eq!(c.mask(), Ok(None), "nothing is masked while waiting");
        // The marker may arrive split across tokens.
        for piece in ["thinking…</th", "ink", ">"] {
            assert!(c.waiting());
            c.observe(piece);
        }
        assert!(!c.waiting());
        let words = c.mask().unwrap().unwrap().to_vec();
        let allowed: Vec<u32> = (0..tok.vocab_size() as u32).filter(|&i| words[i as usize / 32] >> (i % 32) & 1 == 1).collect();
        assert!(!allowed.is_empty() && allowed.len() < 20, "{} tokens allowed", allowed.len());
        for t in allowed {
            let text = tok.decode(&[t], false).unwrap();
            assert!("yes".starts_with(&text) || "no".starts_with(&text), "{text:?} is allowed");
        }
    }
}

//! Cost of structured outputs per decode step: computing the grammar masks of a batch of
//! constrained choices (in parallel, as the engine thread does while the forward runs) and
//! the step's batched draw under them on the CPU, at batch 1 and 64, on the demo model's tokenizer with a nested
//! JSON schema. `cargo bench -p deltaserve --bench structured_masks`; set
//! `DELTASERVE_BENCH_TOKENIZER` to a directory with another `tokenizer.json` (e.g. one of
//! Qwen's 151k-token size) to measure at that vocabulary.

use std::time::Instant;

use deltaserve::structured::{Constraint, Grammars};
use deltaserve_engine::{Device, Draws, Sampler, SamplingParams, Tensor, Tokenizer};
use llguidance::api::TopLevelGrammar;
use rayon::prelude::*;

fn main() {
    let dir = std::env::var_os("DELTASERVE_BENCH_TOKENIZER")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/gdn-demo"));
    let tok = Tokenizer::from_dir(&dir, None, &[]).expect("tokenizer");
    let t0 = Instant::now();
    let vocab = tok.vocab_size();
    let grammars = Grammars::new(&tok, vocab).expect("grammars");
    println!("token trie: {:.0} ms (once at start)", t0.elapsed().as_secs_f64() * 1e3);
    let schema = serde_json::json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 16}, "age": {"type": "integer"},
            "role": {"enum": ["admin", "user", "guest"]},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3}
        },
        "required": ["name", "age", "role", "tags"], "additionalProperties": false,
        "x-guidance": {"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}
    });
    let t0 = Instant::now();
    let base = grammars.compile(TopLevelGrammar::from_json_schema(schema)).expect("compile");
    println!("compile: {:.2} ms (vocabulary {vocab})", t0.elapsed().as_secs_f64() * 1e3);
    println!("| batch | steps | masks, ms per step (parallel) | masked draw, ms per step | µs per choice (both) |");
    println!("|---|---|---|---|---|");
    for batch in [1usize, 64] {
        let mut cs: Vec<Constraint> = (0..batch).map(|_| base.clone()).collect();
        let mut samplers: Vec<Sampler> = (0..batch).map(|_| Sampler::new(SamplingParams::greedy(), &[])).collect();
        let mut steps = 0usize;
        let (mut masks, mut draw) = (std::time::Duration::ZERO, std::time::Duration::ZERO);
        // Each choice follows the grammar by taking the most likely allowed token of made-up
        // logits, a walk of a plausible length through the schema.
        for step in 0..48 {
            let t0 = Instant::now();
            cs.par_iter_mut().for_each(|c| c.prepare());
            masks += t0.elapsed();
            let logits: Vec<f32> = (0..batch * vocab).map(|i| ((i % vocab * 7 + step) % 13) as f32).collect();
            let logits = Tensor::from_vec(logits, (batch, vocab), &Device::Cpu).expect("logits");
            let t0 = Instant::now();
            let mut draws = Draws::new();
            let mut live = Vec::new();
            for (row, (c, s)) in cs.iter_mut().zip(samplers.iter_mut()).enumerate() {
                if let (false, Ok(Some(m))) = (c.is_stopped(), c.mask()) {
                    draws.push(row, s, 0, Some(m));
                    live.push(row);
                }
            }
            let out = draws.run(&logits).expect("draw");
            draw += t0.elapsed();
            for (row, d) in live.iter().zip(out) {
                if let Ok(d) = d {
                    let _ = cs[*row].accept(d.token);
                }
            }
            if live.is_empty() {
                break;
            }
            steps += 1;
        }
        let per = |d: std::time::Duration| d.as_secs_f64() * 1e3 / steps.max(1) as f64;
        let (m, a) = (per(masks), per(draw));
        println!("| {batch} | {steps} | {m:.3} | {a:.3} | {:.1} |", (m + a) * 1e3 / batch as f64);
    }
}

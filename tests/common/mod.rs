//! Helpers shared by the integration tests: fixture locations and error measures.

pub mod invariance;
pub mod prefix;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};

/// This package's directory: `DELTASERVE_TESTS_DIR` when set (a test binary run on another
/// machine, e.g. the GPU host), else where it was built.
pub fn tests_dir() -> PathBuf {
    std::env::var_os("DELTASERVE_TESTS_DIR").map(PathBuf::from).unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}

/// The committed compact fixtures (always present).
pub fn compact_dir() -> PathBuf {
    tests_dir().join("fixtures/compact")
}

/// The full fla-made fixtures at `../shared/fixtures` beside the repository (or at
/// `DELTASERVE_SHARED_FIXTURES`), if present. When absent, prints a visible notice naming the
/// test that could not use them.
pub fn shared_dir(test: &str) -> Option<PathBuf> {
    let dir =
        std::env::var_os("DELTASERVE_SHARED_FIXTURES").map(PathBuf::from).unwrap_or_else(|| tests_dir().join("../../shared/fixtures"));
    if dir.join("README.md").exists() {
        Some(dir)
    } else {
        eprintln!("NOTICE: {test}: ../shared/fixtures not found; only the compact fixtures were checked");
        None
    }
}

/// Loads every tensor of a safetensors file.
pub fn load_tensors(path: &Path) -> HashMap<String, Tensor> {
    candle_core::safetensors::load(path, &Device::Cpu).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Flattens a tensor to f32 values.
pub fn values(t: &Tensor) -> Vec<f32> {
    t.to_dtype(candle_core::DType::F32).unwrap().flatten_all().unwrap().to_vec1().unwrap()
}

/// ‖a − b‖ / ‖b‖ in f64.
pub fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    let num: f64 = a.iter().zip(b).map(|(x, y)| (*x as f64 - *y as f64).powi(2)).sum::<f64>().sqrt();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum::<f64>().sqrt();
    num / den.max(1e-30)
}

/// One model case of a `NAME.goldens.json`.
#[derive(Debug, Clone)]
pub struct GoldenCase {
    /// Prompt ids including BOS.
    pub input_ids: Vec<u32>,
    /// Greedy continuation.
    pub greedy_new_ids: Vec<u32>,
    /// Top-2 logit gap at each greedy step.
    pub top2_margins: Vec<f64>,
    /// The prompt text.
    pub prompt: String,
}

/// Reads the cases of a goldens file.
pub fn golden_cases(path: &Path) -> Vec<GoldenCase> {
    let text = std::fs::read_to_string(path).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let ids = |x: &serde_json::Value| x.as_array().unwrap().iter().map(|i| i.as_u64().unwrap() as u32).collect::<Vec<_>>();
    v["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| GoldenCase {
            input_ids: ids(&c["input_ids"]),
            greedy_new_ids: ids(&c["greedy_new_ids"]),
            top2_margins: c["top2_margins"].as_array().unwrap().iter().map(|m| m.as_f64().unwrap()).collect(),
            prompt: c["prompt"].as_str().unwrap_or_default().to_owned(),
        })
        .collect()
}

/// One op case of an `ops.safetensors` file (fla's float64 naive recurrence), batch element by
/// batch element: `run(inputs, h0)` must return `(o, ht)`. Returns the worst (o, ht) errors.
/// Cases: `gdr`, `gdr_neg` (negative eigenvalues) and `gdp` (gated delta product).
pub fn check_op_case(
    file: &Path,
    case: &str,
    mut run: impl FnMut(deltaserve_kernels::ops::MixerInputs<'_>, Vec<f32>) -> (Vec<f32>, Vec<f32>),
) -> (f64, f64) {
    let t = load_tensors(file);
    let inp = if case == "gdr_neg" { "gdr" } else { case };
    let get = |k: &str| t.get(k).unwrap_or_else(|| panic!("missing {k}")).clone();
    let (q, k, v, g, h0) =
        (get(&format!("{inp}.q")), get(&format!("{inp}.k")), get(&format!("{inp}.v")), get(&format!("{inp}.g")), get(&format!("{inp}.h0")));
    let (beta, o_ref, ht_ref) = (get(&format!("{case}.beta")), get(&format!("{case}.o")), get(&format!("{case}.ht")));
    let (b, tq, _, kd) = q.dims4().unwrap();
    let n = k.dim(1).unwrap() / tq;
    let scale = (kd as f32).powf(-0.5);
    let (mut worst_o, mut worst_h) = (0f64, 0f64);
    for bi in 0..b {
        let sel = |x: &Tensor| x.get(bi).unwrap();
        let inputs =
            deltaserve_kernels::ops::MixerInputs { q: &sel(&q), k: &sel(&k), v: &sel(&v), beta: &sel(&beta), g: Some(&sel(&g)), n, scale };
        let (o, ht) = run(inputs, values(&sel(&h0)));
        worst_o = worst_o.max(rel_err(&o, &values(&sel(&o_ref))));
        worst_h = worst_h.max(rel_err(&ht, &values(&sel(&ht_ref))));
    }
    (worst_o, worst_h)
}

/// A row's top-2 margin: its largest value minus its second largest (0 at a tie).
pub fn top2_margin(row: &[f32]) -> f32 {
    let (mut a, mut b) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
    for &x in row {
        if x > a {
            (a, b) = (x, a);
        } else if x > b {
            b = x;
        }
    }
    a - b
}

/// The goldens' top-2 margin below which greedy steps are no longer compared.
pub const GREEDY_MARGIN: f64 = 1e-3;

/// Greedy generation against `case`'s goldens: from `first` (the logits after the prompt), each
/// argmax must equal the golden token, up to the first step whose top-2 margin is below
/// [`GREEDY_MARGIN`]; `next(token)` feeds a token and returns the following logits. Asserts that
/// at least one step was checked and returns how many were.
pub fn check_greedy(label: &str, case: &GoldenCase, first: Tensor, mut next: impl FnMut(u32) -> Tensor) -> usize {
    let mut logits = first;
    let mut checked = 0;
    for (step, (&want, &margin)) in case.greedy_new_ids.iter().zip(&case.top2_margins).enumerate() {
        if margin < GREEDY_MARGIN {
            break;
        }
        let got = deltaserve_engine::sampling::argmax(&values(&logits));
        assert_eq!(got, want, "{label}: greedy step {step}");
        checked += 1;
        logits = next(got);
    }
    println!("{label}: {checked}/{} greedy steps checked", case.greedy_new_ids.len());
    assert!(checked > 0, "{label}: no greedy step above the margin");
    checked
}

/// The compact model fixtures (`tests/fixtures/compact/NAME`), each made by its own library.
pub const COMPACT_MODELS: [&str; 11] = [
    "gdn",
    "gdn-gva",
    "gdp",
    "delta_net",
    "delta_net-gated",
    "gdn-attn",
    "qwen3_5",
    "olmo_hybrid",
    "olmo_hybrid-rope",
    "qwen3_next",
    "qwen3_5_moe",
];

/// Every model fixture: (name, checkpoint dir, goldens json, logits safetensors).
pub fn model_fixtures(test: &str) -> Vec<(String, PathBuf, PathBuf, PathBuf)> {
    let c = compact_dir();
    let mut v: Vec<_> = COMPACT_MODELS
        .iter()
        .map(|n| (format!("compact/{n}"), c.join(n), c.join(format!("{n}.goldens.json")), c.join(format!("{n}.logits.safetensors"))))
        .collect();
    if let Some(s) = shared_dir(test) {
        for n in ["tiny-gdn", "tiny-gdp"] {
            v.push((n.to_string(), s.join(n), s.join(format!("{n}.goldens.json")), s.join(format!("{n}.logits.safetensors"))));
        }
    }
    v
}

/// `toks` prefilled returning every row's logits, against a prefill returning only the last
/// row's (whose last block runs its output head and MLP for that row alone): the last row's
/// relative error, and whether the next decode step's logits after each are the same bits (the
/// caches, which every row writes).
pub fn last_row_vs_whole_pass(m: &deltaserve_engine::CausalLm, toks: &[u32], algo: deltaserve_engine::PrefillAlgo) -> (f64, bool) {
    use deltaserve_engine::Logits;
    let v = m.config().common.vocab_size;
    let mut pool = m.new_pool(2).unwrap();
    let (a, b) = (pool.allocate().unwrap(), pool.allocate().unwrap());
    let all = values(&m.prefill(&mut pool, a, toks, Logits::All, algo).unwrap());
    let last = values(&m.prefill(&mut pool, b, toks, Logits::Last, algo).unwrap());
    assert_eq!((all.len(), last.len()), (toks.len() * v, v), "logits' shapes");
    let e = rel_err(&last, &all[(toks.len() - 1) * v..]);
    let next_a = values(&m.decode(&mut pool, &[(a, 3)]).unwrap());
    let next_b = values(&m.decode(&mut pool, &[(b, 3)]).unwrap());
    (e, next_a == next_b)
}

/// Packed prefill against prefilling alone, on `model` (pool on its device): three sequences
/// of 70, 1 and 130 tokens in shuffled slots, one of them continuing an earlier prefill, then
/// one decode step. Returns the worst relative error over the last logits, the decode logits
/// and every state.
pub fn packed_model_prefill_error(model: &deltaserve_engine::CausalLm, seed: u64) -> f64 {
    use deltaserve_engine::{Logits, PrefillAlgo, StatePool};
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let vocab = model.config().common.vocab_size as u32;
    let mut toks = |n: usize| -> Vec<u32> { (0..n).map(|_| rng.random_range(0..vocab)).collect() };
    let (head, prompts) = (toks(40), [toks(70), toks(1), toks(130)]);
    let (mut packed, mut alone) = (model.new_pool(6).unwrap(), model.new_pool(6).unwrap());
    let take = |p: &mut StatePool, n: usize| (0..n).map(|_| p.allocate().unwrap()).collect::<Vec<_>>();
    // Shuffle which slots the sequences land in: take all, use them in reverse.
    let (ps, as_) = (take(&mut packed, 6), take(&mut alone, 6));
    let (ps, as_): (Vec<_>, Vec<_>) = ([4usize, 1, 3].iter().map(|&i| ps[i]).collect(), [0usize, 2, 5].iter().map(|&i| as_[i]).collect());
    // Sequence 2 continues an earlier prefill in both pools.
    model.prefill(&mut packed, ps[2], &head, Logits::Last, PrefillAlgo::Chunked).unwrap();
    model.prefill(&mut alone, as_[2], &head, Logits::Last, PrefillAlgo::Chunked).unwrap();
    let batch: Vec<_> = ps.iter().zip(&prompts).map(|(s, p)| (*s, p.as_slice())).collect();
    let lp = model.prefill_many(&mut packed, &batch, PrefillAlgo::Chunked).unwrap();
    let mut worst = 0f64;
    for (i, p) in prompts.iter().enumerate() {
        let la = model.prefill(&mut alone, as_[i], p, Logits::Last, PrefillAlgo::Chunked).unwrap();
        worst = worst.max(rel_err(&values(&lp.get(i).unwrap()), &values(&la)));
    }
    let next: Vec<u32> = (0..3).map(|i| (i * 7 + 1) % vocab).collect();
    let dp = model.decode(&mut packed, &ps.iter().zip(&next).map(|(s, t)| (*s, *t)).collect::<Vec<_>>()).unwrap();
    let da = model.decode(&mut alone, &as_.iter().zip(&next).map(|(s, t)| (*s, *t)).collect::<Vec<_>>()).unwrap();
    worst = worst.max(rel_err(&values(&dp), &values(&da)));
    for (a, b) in ps.iter().zip(&as_) {
        for layer in 0..model.config().common.num_hidden_layers {
            // Attention layers' KV blocks sit at different physical blocks; the logits cover them.
            let (Some(x), Some(y)) = (packed.layer(layer).recurrent(), alone.layer(layer).recurrent()) else { continue };
            for (sx, sy) in [(&x.recurrent_state, &y.recurrent_state), (&x.conv_state, &y.conv_state)] {
                worst = worst.max(rel_err(&sx.slot_to_vec(a.index()).unwrap(), &sy.slot_to_vec(b.index()).unwrap()));
            }
        }
    }
    worst
}

/// Prunes `input` with `method` at ratio 0.5, calibrating (where the method does) on four
/// 128-token windows of `calibration`, on `device`, into a fresh temporary directory; returns
/// the result and the directory (kept alive by the caller).
pub fn prune_half(
    method: deltaserve_pruning::Method,
    input: &Path,
    calibration: &Path,
    seed: u64,
    device: Device,
) -> (Result<deltaserve_pruning::Report, deltaserve_pruning::PruneError>, tempfile::TempDir) {
    let out = tempfile::tempdir().unwrap();
    let opts = deltaserve_pruning::PruneOptions {
        method,
        ratio: 0.5,
        input: input.to_path_buf(),
        output: Some(out.path().to_path_buf()),
        calibration: Some(calibration.to_path_buf()),
        samples: Some(4),
        seq_len: 128,
        seed,
        progress: false,
        device,
    };
    (deltaserve_pruning::prune(&opts), out)
}

/// Tokens two sequences share from the start.
pub fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// The compact fixture `name` loaded as a model of `dtype` on `device`.
pub fn compact_model(name: &str, dtype: candle_core::DType, device: &candle_core::Device) -> deltaserve_engine::CausalLm {
    let dir = compact_dir().join(name);
    let c = deltaserve_engine::read_config(&dir).unwrap();
    let ckpt = deltaserve_engine::weights::Checkpoint::open(&dir).unwrap();
    deltaserve_engine::CausalLm::load(&c, &ckpt, dtype, device, false).unwrap()
}

/// A serving script on an engine (the same calls whatever its tensor parallel size): a chunked
/// prefill writing a snapshot, a restore from it and the rest prefilled, a fork, decode steps of
/// all three (eager, CUDA-graph capture, replays on a GPU), a mixed pass (a new prompt beside
/// their decode rows), a save, a release, and a greedy continuation. Every logit, one entry per
/// call.
pub fn serving_script(e: &deltaserve_engine::Engine) -> Vec<Vec<f32>> {
    let vocab = e.config().common.vocab_size as u32;
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(11);
    let prompt: Vec<u32> = (0..150).map(|_| rand::Rng::random_range(&mut rng, 0..vocab)).collect();
    let size = deltaserve_engine::state::PoolSize { slots: 4, snapshots: 2, kv_blocks: 256, block_size: 16, max_seq_len: 512 };
    let mut pool = e.new_pool_sized(size).unwrap();
    assert_eq!(pool.ranks(), e.tensor_parallel_size(), "a pool has a replica for every rank");
    let (a, snap) = (pool.allocate().unwrap(), pool.take_snapshot().unwrap());
    let mut out = vec![values(
        &e.prefill_many_with(&mut pool, &[(a, &prompt)], &[deltaserve_engine::SnapshotAt { seq: 0, tokens: 128, snap }]).unwrap(),
    )];
    let b = pool.allocate().unwrap();
    assert!(pool.restore(snap, b).unwrap());
    out.push(values(&e.prefill(&mut pool, b, &prompt[128..], deltaserve_engine::Logits::All).unwrap()));
    let c = pool.fork(a).unwrap().unwrap();
    for step in 0..4u32 {
        let batch = [(a, (step * 7) % vocab), (c, (step * 7 + 1) % vocab), (b, (step * 7 + 2) % vocab)];
        out.push(values(&e.decode(&mut pool, &batch).unwrap()));
    }
    // A mixed pass: a new prompt's first 40 tokens beside the three's decode rows.
    let fresh = pool.allocate().unwrap();
    let step = [(c, 3 % vocab), (a, 4 % vocab), (b, 5 % vocab)];
    out.push(values(&e.prefill_and_decode(&mut pool, &[(fresh, &prompt[..40])], &[], &step).unwrap()));
    pool.release(fresh).unwrap();
    pool.save(c, snap).unwrap();
    pool.release(c).unwrap();
    let d = pool.allocate().unwrap();
    assert!(pool.restore(snap, d).unwrap());
    out.push(values(&e.decode(&mut pool, &[(d, 5 % vocab), (a, 6 % vocab)]).unwrap()));
    // Then a greedy continuation of `d` (one call per token, each fed its own argmax).
    let mut next = deltaserve_engine::sampling::argmax(&out[out.len() - 1][..vocab as usize]);
    for _ in 0..SERVING_SCRIPT_GREEDY {
        out.push(values(&e.decode(&mut pool, &[(d, next)]).unwrap()));
        next = deltaserve_engine::sampling::argmax(&out[out.len() - 1]);
    }
    out
}

/// Greedy tokens at the end of [`serving_script`]'s output (its last calls, one row each).
pub const SERVING_SCRIPT_GREEDY: usize = 24;

/// A pool of `init.len()` slots on `device`, slot i holding `init[i]` (each `per_slot` values).
pub fn slots_holding(init: &[Vec<f32>], per_slot: usize, device: &candle_core::Device) -> deltaserve_kernels::SlotBuffer {
    let mut states = deltaserve_kernels::SlotBuffer::zeros_on(init.len(), per_slot, device).unwrap();
    for (i, v) in init.iter().enumerate() {
        states.write_slot(i, v).unwrap();
    }
    states
}

/// Every slot's values, in slot order.
pub fn every_slot(states: &deltaserve_kernels::SlotBuffer, pool: usize) -> Vec<Vec<f32>> {
    (0..pool).map(|i| states.slot_to_vec(i).unwrap()).collect()
}

//! Pruning: exactness of slicing, the written checkpoint's config and shapes, determinism,
//! and every method running on the fixtures.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};
use deltaserve_engine::inventory::expected_tensors;
use deltaserve_engine::weights::Checkpoint;
use deltaserve_engine::{read_config, reference, Logits, PrefillAlgo, StatePool};
use deltaserve_pruning::write::write_checkpoint;
use deltaserve_pruning::{kept_dim, load_model, prune, Method, PruneOptions};
use deltaserve_tests::{compact_dir, prune_half, rel_err, shared_dir, values};

const MODELS: [&str; 3] = ["gdn", "gdn-gva", "gdp"];

fn copy_dir(src: &Path) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(src).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), d.path().join(e.file_name())).unwrap();
    }
    d
}

fn logits(dir: &Path, tokens: &[u32]) -> Vec<f32> {
    let m = load_model(dir).unwrap();
    let mut pool = StatePool::new(&m.cache_specs(), 1);
    let s = pool.allocate().unwrap();
    let mut out = values(&m.prefill(&mut pool, s, tokens, Logits::All, PrefillAlgo::Chunked).unwrap());
    // A few decode steps too: the sliced conv state and recurrent state carry over.
    for t in [3u32, 17, 5] {
        out.extend(values(&m.decode(&mut pool, &[(s, t)]).unwrap()));
    }
    out
}

/// A text file to calibrate on, from this repository's sources (compact tokenizers are tiny).
fn calibration_text() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut text = String::new();
    for f in ["README.md", "engine/src/config/mod.rs", "kernels/src/cpu/gated_delta.rs", "engine/src/sampling.rs"] {
        text.push_str(&std::fs::read_to_string(root.join(f)).unwrap());
    }
    let path = std::env::temp_dir().join(format!("deltaserve-calib-{}.txt", std::process::id()));
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn pruning_unreachable_channels_changes_no_logit() {
    // Zero the q and k rows of the channels to drop: they become exact zeros after the conv and
    // SiLU, so the L2 norm, the state and the read-out ignore them. The only remaining
    // difference is the read-out scale 1/√d vs 1/√k, which the per-head o_norm cancels except
    // through its eps; a negligible eps makes the two models equal up to float rounding.
    for name in MODELS {
        let full = copy_dir(&compact_dir().join(name));
        let cfg_path = full.path().join("config.json");
        let mut raw: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
        raw["norm_eps"] = 1e-30.into();
        std::fs::write(&cfg_path, raw.to_string()).unwrap();
        let cfg = read_config(full.path()).unwrap();
        let (h, d, key_dim, n) = (cfg.num_heads(), cfg.head_k_dim(), cfg.key_dim(), cfg.num_householder());
        // Different, unsorted-looking subsets per layer and head.
        // k = 5/8 of the channels, a different subset per layer and head, in a shuffled
        // (pivot-like) order.
        let k = d * 5 / 8;
        let sel: Vec<Vec<Vec<usize>>> = (0..cfg.common.num_hidden_layers)
            .map(|l| {
                (0..h)
                    .map(|hh| {
                        let mut idx: Vec<usize> = (0..d).collect();
                        idx.sort_by_key(|c| (c * 7 + l * 3 + hh * 5) % d);
                        idx.truncate(k);
                        idx
                    })
                    .collect()
            })
            .collect();
        let ws = full.path().join("model.safetensors");
        let mut t: HashMap<String, Tensor> = candle_core::safetensors::load(&ws, &Device::Cpu).unwrap();
        for (l, heads) in sel.iter().enumerate() {
            let mut keep = vec![0f32; key_dim];
            for (hh, idx) in heads.iter().enumerate() {
                for &c in idx {
                    keep[hh * d + c] = 1.0;
                }
            }
            for (proj, blocks) in [("q_proj", 1), ("k_proj", n)] {
                let key = format!("model.layers.{l}.attn.{proj}.weight");
                let w = &t[&key];
                let mask: Vec<f32> = (0..blocks).flat_map(|_| keep.iter().copied()).collect();
                let mask = Tensor::new(mask.as_slice(), &Device::Cpu).unwrap().to_dtype(w.dtype()).unwrap().unsqueeze(1).unwrap();
                let z = w.broadcast_mul(&mask).unwrap();
                t.insert(key, z);
            }
        }
        candle_core::safetensors::save(&t, &ws).unwrap();
        let pruned = tempfile::tempdir().unwrap();
        let new_cfg = write_checkpoint(full.path(), pruned.path(), &cfg, &sel).unwrap();
        assert_eq!(new_cfg.head_k_dim(), sel[0][0].len());
        let tokens: Vec<u32> = (0..150).map(|i| (i * 37 % 500) as u32 + 3).collect();
        let e = rel_err(&logits(pruned.path(), &tokens), &logits(full.path(), &tokens));
        println!("{name}: pruned vs zeroed full model: rel err {e:.2e}");
        assert!(e < 1e-5, "{name}: rel err {e:.3e}");
    }
}

#[test]
fn pruned_checkpoints_follow_fla_config_rules_and_shapes() {
    for name in MODELS {
        let src = compact_dir().join(name);
        let cfg = read_config(&src).unwrap();
        for ratio in [0.25, 0.5, 0.75] {
            let out = tempfile::tempdir().unwrap();
            let r = prune(&PruneOptions {
                method: Method::L1,
                ratio,
                input: src.clone(),
                output: Some(out.path().to_path_buf()),
                calibration: None,
                samples: None,
                seq_len: 64,
                seed: 1,
                progress: false,
                device: candle_core::Device::Cpu,
            })
            .unwrap();
            let k = kept_dim(cfg.head_k_dim(), ratio);
            assert_eq!(r.head_dim, (cfg.head_k_dim(), k));
            // Config: head_dim = k; expand_v keeps int(head_dim·expand_v) = old head_v_dim;
            // every other field unchanged.
            let raw: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(out.path().join("config.json")).unwrap()).unwrap();
            assert_eq!(raw["head_dim"], k);
            let ev = raw["expand_v"].as_f64().unwrap();
            assert_eq!((k as f64 * ev) as usize, cfg.head_v_dim(), "{name} {ratio}");
            for (key, v) in cfg.raw.as_object().unwrap() {
                if key != "head_dim" && key != "expand_v" {
                    assert_eq!(&raw[key], v, "{name}: field {key} changed");
                }
            }
            let new_cfg = read_config(out.path()).unwrap();
            assert_eq!(new_cfg.head_v_dim(), cfg.head_v_dim());
            assert_eq!(new_cfg.num_v_heads(), cfg.num_v_heads());
            // Shapes: exactly fla's inventory for the new config, dtypes as before, and
            // untouched tensors byte-identical.
            let (a, b) = (Checkpoint::open(&src).unwrap(), Checkpoint::open(out.path()).unwrap());
            let want: HashMap<String, Vec<usize>> = expected_tensors(&new_cfg).into_iter().collect();
            assert_eq!(b.names().len(), want.len(), "{name}: tensor count");
            for (key, shape) in &want {
                assert_eq!(b.shape(key).unwrap(), shape.as_slice(), "{name}: {key}");
                assert_eq!(b.dtype(key), a.dtype(key), "{name}: {key} dtype");
                let sliced = ["q_proj", "k_proj", "q_conv1d", "k_conv1d"].iter().any(|p| key.contains(&format!("attn.{p}.")));
                if !sliced {
                    let dt = a.dtype(key).unwrap();
                    let (x, y) = (a.load_raw(key, dt, &Device::Cpu).unwrap(), b.load_raw(key, dt, &Device::Cpu).unwrap());
                    assert_eq!(values(&x), values(&y), "{name}: {key} changed");
                }
            }
            // State shrinks as the config says, and the model runs.
            assert!(r.state_bytes_per_sequence.1 < r.state_bytes_per_sequence.0);
            let l = logits(out.path(), &[1, 5, 9, 30]);
            assert!(l.iter().all(|x| x.is_finite()));
            // The report lists k indices per head and layer.
            let rep: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(out.path().join("pruning_report.json")).unwrap()).unwrap();
            assert_eq!(rep["kept"].as_array().unwrap().len(), cfg.common.num_hidden_layers);
            assert_eq!(rep["kept"][0][0].as_array().unwrap().len(), k);
        }
    }
}

#[test]
fn every_method_runs_on_the_fixtures_and_is_deterministic() {
    let calib = calibration_text();
    let mut dirs: Vec<(String, PathBuf)> = MODELS.iter().map(|n| (n.to_string(), compact_dir().join(n))).collect();
    if let Some(s) = shared_dir("every_method_runs_on_the_fixtures_and_is_deterministic") {
        dirs.push(("tiny-gdp".into(), s.join("tiny-gdp")));
    }
    for (name, dir) in dirs {
        for method in [Method::Rand, Method::L1, Method::Swanda, Method::Grad, Method::Drrqr] {
            let run = |seed: u64| {
                let (r, out) = prune_half(method, &dir, &calib, seed, candle_core::Device::Cpu);
                let r = r.unwrap_or_else(|e| panic!("{name} {method:?}: {e}"));
                let bytes = std::fs::read(out.path().join("model.safetensors")).unwrap();
                (r, bytes)
            };
            let (a, wa) = run(7);
            let (b, wb) = run(7);
            assert_eq!(a.kept, b.kept, "{name} {method:?}: not deterministic");
            assert_eq!(wa, wb, "{name} {method:?}: weights differ between runs");
            if method == Method::Drrqr {
                let info = a.drrqr.as_ref().unwrap();
                assert!(info.iter().flatten().all(|h| h.max_rho <= 1.5 + 1e-9 || h.swaps == 20), "{name}: bound");
                assert!(a.rank_before.is_some() && a.rank_after.is_some());
            }
            if method == Method::Rand {
                let (c, _) = run(8);
                assert_ne!(a.kept, c.kept, "{name}: rand ignores the seed");
            }
        }
    }
}

#[test]
fn bad_options_are_refused() {
    let src = compact_dir().join("gdn");
    let out = tempfile::tempdir().unwrap();
    let opts = |method, ratio| PruneOptions {
        method,
        ratio,
        input: src.clone(),
        output: Some(out.path().to_path_buf()),
        calibration: None,
        samples: None,
        seq_len: 64,
        seed: 0,
        progress: false,
        device: candle_core::Device::Cpu,
    };
    let e = prune(&opts(Method::L1, 1.0)).unwrap_err().to_string();
    assert_eq!(e, "invalid `ratio`: expected in [0, 1), got 1");
    // The bundled calibration text holds fewer tokens than one such window.
    let e = prune(&PruneOptions { seq_len: 10_000_000, ..opts(Method::Drrqr, 0.5) }).unwrap_err().to_string();
    assert!(
        e.starts_with("invalid `calibration`: expected text of at least 10000000 tokens") && e.contains("the bundled calibration text"),
        "{e}"
    );
    let missing = out.path().join("no-such-file.txt");
    let e = prune(&PruneOptions { calibration: Some(missing.clone()), ..opts(Method::Swanda, 0.5) }).unwrap_err().to_string();
    assert!(e.starts_with(&missing.display().to_string()), "{e}");
}

#[test]
fn default_output_sits_beside_the_input() {
    use deltaserve_pruning::default_output;
    assert_eq!(default_output(Path::new("ckpt/"), Method::Drrqr, 0.5), PathBuf::from("ckpt-drrqr-0.5"));
    assert_eq!(default_output(Path::new("/m/qwen"), Method::L1, 0.25), PathBuf::from("/m/qwen-l1-0.25"));
}

/// The compact models plus the full fla fixtures when present.
fn fixture_models(test: &str) -> Vec<(String, PathBuf)> {
    let mut dirs: Vec<(String, PathBuf)> = MODELS.iter().map(|n| (n.to_string(), compact_dir().join(n))).collect();
    if let Some(s) = shared_dir(test) {
        dirs.extend(["tiny-gdn", "tiny-gdp"].map(|n| (n.to_string(), s.join(n))));
    }
    dirs
}

#[test]
fn reference_forward_matches_the_engine() {
    // The reference forward (calibration, Grad) is a second implementation of the model in plain tensor ops; it must give
    // the engine's logits. 150 tokens span three 64-token chunks with a ragged tail.
    let tokens: Vec<u32> = (0..150u32).map(|i| (i * 37 + 11) % 200).collect();
    for (name, dir) in fixture_models("reference_forward_matches_the_engine") {
        let m = load_model(&dir).unwrap();
        let mut pool = StatePool::new(&m.cache_specs(), 1);
        let s = pool.allocate().unwrap();
        let want = values(&m.prefill(&mut pool, s, &tokens, Logits::All, PrefillAlgo::Chunked).unwrap());
        let got = values(&reference::logits(&m, &tokens, &reference::qk_proj(&m).unwrap(), None).unwrap());
        let e = rel_err(&got, &want);
        println!("{name}: reference vs engine logits rel err {e:.2e}");
        assert!(e < 1e-4, "{name}: {e}");
    }
}

/// ⟨x, y⟩ over per-layer (q, k) tensor pairs, in f64.
fn dot(x: &[(Tensor, Tensor)], y: &[(Tensor, Tensor)]) -> f64 {
    let one = |a: &Tensor, b: &Tensor| (a * b).unwrap().sum_all().unwrap().to_scalar::<f32>().unwrap() as f64;
    x.iter().zip(y).map(|((xq, xk), (yq, yk))| one(xq, yq) + one(xk, yk)).sum()
}

#[test]
fn loss_gradient_matches_finite_differences() {
    use candle_core::Var;
    use deltaserve_engine::reference::QkProj;
    let tokens: Vec<u32> = (0..100u32).map(|i| (i * 53 + 7) % 120).collect();
    for (name, dir) in fixture_models("loss_gradient_matches_finite_differences") {
        let m = load_model(&dir).unwrap();
        let base = reference::qk_proj(&m).unwrap();
        let vars: Vec<(Var, Var)> = base.iter().map(|w| (Var::from_tensor(&w.q).unwrap(), Var::from_tensor(&w.k).unwrap())).collect();
        let qk: Vec<QkProj> = vars.iter().map(|(q, k)| QkProj { q: q.as_tensor().clone(), k: k.as_tensor().clone() }).collect();
        let grads = reference::lm_loss(&m, &tokens, &qk).unwrap().backward().unwrap();
        let g: Vec<(Tensor, Tensor)> =
            vars.iter().map(|(q, k)| (grads.get(q.as_tensor()).unwrap().clone(), grads.get(k.as_tensor()).unwrap().clone())).collect();
        let norm = dot(&g, &g).sqrt();
        assert!(norm > 0.0, "{name}: zero gradient");
        // Along the gradient the directional derivative is ‖G‖; along a random unit direction
        // it is ⟨G, d⟩. Central differences in f32 must reproduce both.
        let random: Vec<(Tensor, Tensor)> =
            base.iter().map(|w| (w.q.randn_like(0.0, 1.0).unwrap(), w.k.randn_like(0.0, 1.0).unwrap())).collect();
        // Along the gradient, curvature costs ~1% at this step; a random direction's small
        // derivative is held to a tighter absolute bound.
        for (label, dir, tol) in [("gradient", g.clone(), 2e-2), ("random", random, 2e-3)] {
            let dn = dot(&dir, &dir).sqrt();
            let want = dot(&dir, &g) / dn;
            let eps = 2e-3;
            let shifted = |sign: f64| -> f64 {
                let w: Vec<QkProj> = base
                    .iter()
                    .zip(&dir)
                    .map(|(w, (a, b))| QkProj {
                        q: (&w.q + (a * (sign * eps / dn)).unwrap()).unwrap(),
                        k: (&w.k + (b * (sign * eps / dn)).unwrap()).unwrap(),
                    })
                    .collect();
                reference::lm_loss(&m, &tokens, &w).unwrap().to_scalar::<f32>().unwrap() as f64
            };
            let fd = (shifted(1.0) - shifted(-1.0)) / (2.0 * eps);
            println!("{name} {label}: autograd {want:.6e}, finite difference {fd:.6e}, ‖G‖ {norm:.3e}");
            assert!((fd - want).abs() <= tol * norm, "{name} {label}: autograd {want} vs finite difference {fd}");
        }
    }
}

//! Hybrid checkpoints in the layouts and file sets they come in: Qwen3.5's text-only class
//! (`model.*` keys, `qwen3_5_text` config at the top level) and the released wrapper with an
//! `mtp.*` head beside it, the template in `chat_template.jinja`, and stop ids listed in
//! `generation_config.json`; MoE experts packed (either axis order) or one by one. Each variant
//! must give the logits of the fixture as its library saved it.

use std::path::Path;

use candle_core::{Device, Tensor};
use deltaserve_engine::{Engine, LoadOptions, Logits};
use deltaserve_tests::{compact_dir, golden_cases, load_tensors, rel_err, values};

/// A copy of the `qwen3_5` fixture whose tensors and config are rewritten by `edit`.
fn variant(edit: impl Fn(&mut Vec<(String, Tensor)>, &mut serde_json::Value)) -> tempfile::TempDir {
    variant_of("qwen3_5", edit)
}

/// A copy of fixture `name` whose tensors and config are rewritten by `edit`.
fn variant_of(name: &str, edit: impl Fn(&mut Vec<(String, Tensor)>, &mut serde_json::Value)) -> tempfile::TempDir {
    let src = compact_dir().join(name);
    let d = tempfile::tempdir().unwrap();
    for f in ["tokenizer.json", "tokenizer_config.json", "generation_config.json"] {
        std::fs::copy(src.join(f), d.path().join(f)).unwrap();
    }
    let mut tensors: Vec<(String, Tensor)> = load_tensors(&src.join("model.safetensors")).into_iter().collect();
    let mut cfg: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    edit(&mut tensors, &mut cfg);
    let map: std::collections::HashMap<_, _> = tensors.into_iter().collect();
    candle_core::safetensors::save(&map, d.path().join("model.safetensors")).unwrap();
    std::fs::write(d.path().join("config.json"), cfg.to_string()).unwrap();
    d
}

/// Last-token logits of golden case 0, and the fixture's reference logits.
fn case0_error(dir: &Path) -> f64 {
    case_error("qwen3_5", dir, 0)
}

/// The error of `dir`'s logits on golden case `case` of fixture `name`: all positions where the
/// goldens have them, else the last.
fn case_error(name: &str, dir: &Path, case: usize) -> f64 {
    let engine = Engine::load(&LoadOptions::cpu(dir.to_str().unwrap())).unwrap();
    let c = &golden_cases(&compact_dir().join(format!("{name}.goldens.json")))[case];
    let reference = load_tensors(&compact_dir().join(format!("{name}.logits.safetensors")));
    let mut pool = engine.new_pool(1).unwrap();
    let s = pool.allocate().unwrap();
    match reference.get(&format!("case{case}.all_logits")) {
        Some(all) => rel_err(&values(&engine.prefill(&mut pool, s, &c.input_ids, Logits::All).unwrap()), &values(all)),
        None => rel_err(
            &values(&engine.prefill(&mut pool, s, &c.input_ids, Logits::Last).unwrap()),
            &values(&reference[&format!("case{case}.last_logits")]),
        ),
    }
}

/// Packed `experts.gate_up_proj` [E, 2I, D] / `experts.down_proj` [E, D, I] rewritten one
/// expert at a time, as transformers 5.17 saves them.
fn unpack_experts(tensors: &mut Vec<(String, Tensor)>) {
    let packed: Vec<(String, Tensor)> = tensors.iter().filter(|(k, _)| k.contains(".experts.")).cloned().collect();
    tensors.retain(|(k, _)| !k.contains(".experts."));
    for (k, t) in packed {
        let (prefix, what) = k.rsplit_once('.').unwrap();
        for e in 0..t.dim(0).unwrap() {
            let x = t.get(e).unwrap();
            let i = x.dim(0).unwrap() / 2;
            if what == "gate_up_proj" {
                tensors.push((format!("{prefix}.{e}.gate_proj.weight"), x.narrow(0, 0, i).unwrap().contiguous().unwrap()));
                tensors.push((format!("{prefix}.{e}.up_proj.weight"), x.narrow(0, i, i).unwrap().contiguous().unwrap()));
            } else {
                tensors.push((format!("{prefix}.{e}.down_proj.weight"), x.contiguous().unwrap()));
            }
        }
    }
}

#[test]
fn qwen3_5_text_only_layout_loads_with_the_same_logits() {
    let d = variant(|tensors, cfg| {
        tensors.retain(|(k, _)| !k.starts_with("model.visual."));
        for (k, _) in tensors.iter_mut() {
            *k = k.replace("model.language_model.", "model.");
        }
        let mut text = cfg["text_config"].clone();
        text["architectures"] = serde_json::json!(["Qwen3_5ForCausalLM"]);
        *cfg = text;
    });
    let e = case0_error(d.path());
    assert!(e < 1e-4, "text-only layout: {e:.3e}");
}

#[test]
fn mtp_head_and_vision_tower_are_skipped() {
    let d = variant(|tensors, _| {
        tensors.push(("mtp.fc.weight".into(), Tensor::ones((64, 128), candle_core::DType::F32, &Device::Cpu).unwrap()));
        tensors.push(("mtp.layers.0.input_layernorm.weight".into(), Tensor::ones(64, candle_core::DType::F32, &Device::Cpu).unwrap()));
    });
    let e = case0_error(d.path());
    assert!(e < 1e-4, "with mtp.*: {e:.3e}");
}

#[test]
fn stop_ids_from_generation_config_and_template_from_its_own_file() {
    let engine = Engine::load(&LoadOptions::cpu(compact_dir().join("qwen3_5").to_str().unwrap())).unwrap();
    // The fixture's generation_config.json lists two ids, as Qwen's releases do.
    assert_eq!(engine.tokenizer().eos_token_ids, vec![2, 5]);
    let d = variant(|_, _| {});
    let tc_path = d.path().join("tokenizer_config.json");
    let mut tc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&tc_path).unwrap()).unwrap();
    tc.as_object_mut().unwrap().remove("chat_template");
    std::fs::write(&tc_path, tc.to_string()).unwrap();
    std::fs::write(d.path().join("chat_template.jinja"), "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}").unwrap();
    let engine = Engine::load(&LoadOptions::cpu(d.path().to_str().unwrap())).unwrap();
    assert_eq!(engine.tokenizer().chat_template.as_deref(), Some("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"));
}

#[test]
fn moe_experts_load_packed_in_either_axis_order_or_one_by_one() {
    // The fixture as written: packed [E, 2I, D] / [E, D, I].
    let e = case_error("qwen3_5_moe", &compact_dir().join("qwen3_5_moe"), 0);
    assert!(e < 1e-4, "packed: {e:.3e}");
    let d = variant_of("qwen3_5_moe", |tensors, _| unpack_experts(tensors));
    let e = case_error("qwen3_5_moe", d.path(), 0);
    assert!(e < 1e-4, "one by one: {e:.3e}");
    // Qwen3-VL-MoE's convention: the last two axes swapped.
    let d = variant_of("qwen3_5_moe", |tensors, _| {
        for (k, t) in tensors.iter_mut() {
            if k.ends_with("experts.gate_up_proj") || k.ends_with("experts.down_proj") {
                *t = t.transpose(1, 2).unwrap().contiguous().unwrap();
            }
        }
    });
    let e = case_error("qwen3_5_moe", d.path(), 0);
    assert!(e < 1e-4, "packed, transposed: {e:.3e}");
}

#[test]
fn a_missing_expert_tensor_is_named_with_its_shape() {
    let d = variant_of("qwen3_next", |tensors, _| tensors.retain(|(k, _)| k != "model.layers.3.mlp.experts.6.down_proj.weight"));
    let e = Engine::load(&LoadOptions::cpu(d.path().to_str().unwrap())).unwrap_err().to_string();
    assert!(e.contains("model.layers.3.mlp.experts.6.down_proj.weight") && e.contains("[64, 32]"), "{e}");
}

/// Layer 0 of both MoE fixtures gives experts 3 and 5 the same router row, so their
/// probabilities tie exactly on every token; where the top-k boundary falls between them the
/// reference took expert 3 (the lower index). The long case's logits match the goldens (also
/// checked in `model_parity`), and swapping the two experts' weights moves them far away:
/// the tie-break decides those logits, and ours is the reference's.
#[test]
fn router_ties_pick_the_experts_the_reference_picks() {
    for name in ["qwen3_next", "qwen3_5_moe"] {
        let goldens: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(compact_dir().join(format!("{name}.goldens.json"))).unwrap()).unwrap();
        let r = &goldens["layer0_routing"];
        assert_eq!(r["tied_experts"], serde_json::json!([3, 5]));
        let case = r["case"].as_u64().unwrap() as usize;
        let ties = r["boundary_ties"].as_u64().unwrap();
        assert!(ties > 0, "{name}: the fixture has no tie at the top-k boundary");
        // Wherever exactly one of the tied pair was chosen, the reference chose 3.
        let chosen: Vec<Vec<u64>> = serde_json::from_value(r["experts"].clone()).unwrap();
        assert!(chosen.iter().all(|e| !e.contains(&5) || e.contains(&3)), "{name}: {chosen:?}");
        let e = case_error(name, &compact_dir().join(name), case);
        assert!(e < 1e-4, "{name} case{case}: {e:.3e}");
        let swapped = variant_of(name, |tensors, _| {
            if name == "qwen3_5_moe" {
                unpack_experts(tensors);
            }
            for (k, _) in tensors.iter_mut() {
                for (a, b) in
                    [(".layers.0.mlp.experts.3.", ".layers.0.mlp.experts.5."), (".layers.0.mlp.experts.5.", ".layers.0.mlp.experts.3.")]
                {
                    if k.contains(a) {
                        *k = k.replace(a, b);
                        break;
                    }
                }
            }
        });
        let e = case_error(name, swapped.path(), case);
        println!("{name}: {ties} boundary ties; logits error {e:.2e} with experts 3 and 5 swapped");
        assert!(e > 1e-2, "{name}: swapping the tied experts changed nothing ({e:.3e})");
    }
}

/// Released MoE checkpoints come in tens of shards behind `model.safetensors.index.json`: the
/// Qwen3-Next fixture split into three shards (by sorted name, so layers straddle shards)
/// loads to the same logits.
#[test]
fn a_sharded_moe_checkpoint_loads_with_the_same_logits() {
    let d = variant_of("qwen3_next", |_, _| {});
    let mut tensors: Vec<(String, Tensor)> = load_tensors(&d.path().join("model.safetensors")).into_iter().collect();
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    std::fs::remove_file(d.path().join("model.safetensors")).unwrap();
    let per = tensors.len().div_ceil(3);
    let mut weight_map = serde_json::Map::new();
    for (s, chunk) in tensors.chunks(per).enumerate() {
        let file = format!("model-{:05}-of-00003.safetensors", s + 1);
        for (k, _) in chunk {
            weight_map.insert(k.clone(), file.clone().into());
        }
        let map: std::collections::HashMap<_, _> = chunk.iter().cloned().collect();
        candle_core::safetensors::save(&map, d.path().join(&file)).unwrap();
    }
    let index = serde_json::json!({"metadata": {}, "weight_map": weight_map});
    std::fs::write(d.path().join("model.safetensors.index.json"), index.to_string()).unwrap();
    let e = case_error("qwen3_next", d.path(), 0);
    assert!(e < 1e-4, "sharded: {e:.3e}");
}

/// The inventories of transformers' families (what `init-random` writes: Qwen3.5's and
/// Qwen3.5-MoE's text layouts, Qwen3-Next's, OLMo-Hybrid's) against the tensors transformers saved
/// in their fixtures: the same names and shapes, once the wrapper's `model.language_model.` prefix
/// is read as `model.` and its vision tower left out.
#[test]
fn the_transformers_inventories_are_the_layouts_transformers_saves() {
    for name in ["qwen3_5", "qwen3_5_moe", "qwen3_next", "olmo_hybrid", "olmo_hybrid-rope"] {
        let dir = compact_dir().join(name);
        let cfg = deltaserve_engine::read_config(&dir).unwrap();
        let ckpt = deltaserve_engine::weights::Checkpoint::open(&dir).unwrap();
        let mut saved: Vec<(String, Vec<usize>)> = ckpt
            .names()
            .into_iter()
            .filter(|n| !n.starts_with("model.visual.") && !n.starts_with("mtp."))
            .map(|n| (n.replacen("model.language_model.", "model.", 1), ckpt.shape(&n).unwrap().to_vec()))
            .collect();
        let mut listed = deltaserve_engine::inventory::expected_tensors(&cfg);
        saved.sort();
        listed.sort();
        assert_eq!(listed, saved, "{name}");
    }
}

/// Random checkpoints of the Qwen configs (`init-random`'s writer) load and run: their
/// zero-centred decoder norms drawn near 0, the linear-attention output norm near 1.
#[test]
fn random_qwen_checkpoints_load_and_run() {
    for name in ["qwen3_5", "qwen3_5_moe", "qwen3_next"] {
        let cfg_json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(compact_dir().join(name).join("config.json")).unwrap()).unwrap();
        let d = tempfile::tempdir().unwrap();
        deltaserve_engine::synth::write_random_checkpoint(&cfg_json, d.path(), candle_core::DType::F32, 3, Some(&compact_dir().join(name)))
            .unwrap();
        let t = load_tensors(&d.path().join("model.safetensors"));
        let mean = |k: &str| values(&t[k]).iter().map(|&x| x as f64).sum::<f64>() / t[k].elem_count() as f64;
        assert!(mean("model.layers.0.input_layernorm.weight").abs() < 0.1, "{name}: a zero-centred norm near 0");
        assert!((mean("model.layers.0.linear_attn.norm.weight") - 1.0).abs() < 0.1, "{name}: the GDN output norm near 1");
        let engine = Engine::load(&LoadOptions::cpu(d.path().to_str().unwrap())).unwrap();
        let mut pool = engine.new_pool(1).unwrap();
        let slot = pool.allocate().unwrap();
        let logits = values(
            &engine.model().prefill(&mut pool, slot, &[1, 2, 3, 4, 5], Logits::Last, deltaserve_engine::PrefillAlgo::Chunked).unwrap(),
        );
        let text = cfg_json.get("text_config").unwrap_or(&cfg_json);
        assert_eq!(logits.len(), text["vocab_size"].as_u64().unwrap() as usize, "{name}");
        assert!(logits.iter().all(|x| x.is_finite()), "{name}: finite logits");
    }
}

/// A random OLMo-Hybrid checkpoint (`init-random`'s writer) loads and runs: its plain norms drawn
/// near 1, its short conv cut into thirds as transformers saves it.
#[test]
fn a_random_olmo_hybrid_checkpoint_loads_and_runs() {
    let cfg_json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(compact_dir().join("olmo_hybrid/config.json")).unwrap()).unwrap();
    let d = tempfile::tempdir().unwrap();
    deltaserve_engine::synth::write_random_checkpoint(
        &cfg_json,
        d.path(),
        candle_core::DType::F32,
        3,
        Some(&compact_dir().join("olmo_hybrid")),
    )
    .unwrap();
    let t = load_tensors(&d.path().join("model.safetensors"));
    let mean = |k: &str| values(&t[k]).iter().map(|&x| x as f64).sum::<f64>() / t[k].elem_count() as f64;
    for norm in ["model.layers.0.attention_layer_norm.weight", "model.layers.1.post_feedforward_layernorm.weight"] {
        assert!((mean(norm) - 1.0).abs() < 0.1, "{norm} near 1");
    }
    // The fixture's 2 key heads of 16 and 4 value heads of 24: 160 conv channels as 54 / 54 / 52.
    let rows: Vec<usize> = ["q", "k", "v"].iter().map(|x| t[&format!("model.layers.0.linear_attn.{x}_conv1d.weight")].dims()[0]).collect();
    assert_eq!(rows, [54, 54, 52]);
    let engine = Engine::load(&LoadOptions::cpu(d.path().to_str().unwrap())).unwrap();
    let mut pool = engine.new_pool(1).unwrap();
    let slot = pool.allocate().unwrap();
    let logits =
        values(&engine.model().prefill(&mut pool, slot, &[1, 2, 3, 4, 5], Logits::Last, deltaserve_engine::PrefillAlgo::Chunked).unwrap());
    assert_eq!(logits.len(), cfg_json["vocab_size"].as_u64().unwrap() as usize);
    assert!(logits.iter().all(|x| x.is_finite()), "finite logits");
}

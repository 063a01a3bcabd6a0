//! Hybrid checkpoints in the layouts and file sets they come in: Qwen3.5's text-only class
//! (`model.*` keys, `qwen3_5_text` config at the top level) and the released wrapper with an
//! `mtp.*` head beside it, the template in `chat_template.jinja`, and stop ids listed in
//! `generation_config.json`. Each variant must give the logits of the fixture as transformers saved it.

use std::path::Path;

use candle_core::{Device, Tensor};
use deltaserve_engine::{Engine, LoadOptions, Logits};
use deltaserve_tests::{compact_dir, golden_cases, load_tensors, rel_err, values};

/// A copy of the `qwen3_5` fixture whose tensors and config are rewritten by `edit`.
fn variant(edit: impl Fn(&mut Vec<(String, Tensor)>, &mut serde_json::Value)) -> tempfile::TempDir {
    let src = compact_dir().join("qwen3_5");
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
    let engine = Engine::load(&LoadOptions::cpu(dir.to_str().unwrap())).unwrap();
    let case = &golden_cases(&compact_dir().join("qwen3_5.goldens.json"))[0];
    let reference = load_tensors(&compact_dir().join("qwen3_5.logits.safetensors"));
    let mut pool = engine.new_pool(1).unwrap();
    let s = pool.allocate().unwrap();
    let got = engine.prefill(&mut pool, s, &case.input_ids, Logits::Last).unwrap();
    rel_err(&values(&got), &values(&reference["case0.last_logits"]))
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

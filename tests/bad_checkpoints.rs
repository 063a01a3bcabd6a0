//! Corrupt, mismatched and unsupported checkpoints fail with messages that name the tensor or
//! field, the expected value and the actual one.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{Device, Tensor};
use deltaserve_engine::{Engine, LoadOptions};
use deltaserve_tests::compact_dir;

/// A writable copy of the compact GDN checkpoint.
fn copy_gdn() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(compact_dir().join("gdn")).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dir.path().join(e.file_name())).unwrap();
    }
    dir
}

fn load_err(dir: &Path) -> String {
    load_err_split(dir, 1)
}

/// The error of loading `dir` split over `tp` ranks (on the CPU, ranks as threads).
fn load_err_split(dir: &Path, tp: usize) -> String {
    let opts = LoadOptions { check_weights: true, tensor_parallel_size: tp, ..LoadOptions::cpu(dir.to_str().unwrap()) };
    Engine::load(&opts).unwrap_err().to_string()
}

fn rewrite_tensors(dir: &Path, f: impl FnOnce(&mut HashMap<String, Tensor>)) {
    let path = dir.join("model.safetensors");
    let mut t = candle_core::safetensors::load(&path, &Device::Cpu).unwrap();
    f(&mut t);
    candle_core::safetensors::save(&t, &path).unwrap();
}

fn edit_config(dir: &Path, f: impl FnOnce(&mut serde_json::Value)) {
    let path = dir.join("config.json");
    let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    f(&mut v);
    std::fs::write(&path, v.to_string()).unwrap();
}

#[test]
fn missing_tensor_is_named_with_its_shape() {
    let d = copy_gdn();
    rewrite_tensors(d.path(), |t| {
        t.remove("model.layers.1.attn.k_proj.weight");
    });
    let e = load_err(d.path());
    assert_eq!(e, "missing tensor `model.layers.1.attn.k_proj.weight` (expected shape [64, 64])");
    // Split, the layers are read on a thread of their own while the ranks take their slices.
    assert_eq!(load_err_split(d.path(), 2), e);
}

#[test]
fn wrong_shape_names_expected_and_actual() {
    let d = copy_gdn();
    rewrite_tensors(d.path(), |t| {
        t.insert("model.layers.0.attn.o_norm.weight".into(), Tensor::ones(47, candle_core::DType::F32, &Device::Cpu).unwrap());
    });
    let e = load_err(d.path());
    assert_eq!(e, "tensor `model.layers.0.attn.o_norm.weight` has shape [47], expected [48]");
    assert_eq!(load_err_split(d.path(), 2), e);
}

#[test]
fn truncated_safetensors_names_the_file() {
    let d = copy_gdn();
    let path = d.path().join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() - 1000]).unwrap();
    let e = load_err(d.path());
    assert!(e.starts_with("cannot read weights from ") && e.contains("model.safetensors"), "{e}");
    let (want, got) = (bytes.len(), bytes.len() - 1000);
    assert!(e.contains(&format!("truncated: expected {want} bytes (from its header), the file has {got}")), "{e}");
    // Cut inside the header: the header's own length is what the file lacks.
    std::fs::write(&path, &bytes[..100]).unwrap();
    let e = load_err(d.path());
    assert!(e.contains("truncated: expected") && e.contains("the file has 100"), "{e}");
}

#[test]
fn non_finite_weights_are_found_with_check_weights() {
    let d = copy_gdn();
    rewrite_tensors(d.path(), |t| {
        let w = Tensor::new(&[1.0f32, f32::NAN, f32::INFINITY], &Device::Cpu).unwrap().pad_with_zeros(0, 0, 61).unwrap();
        t.insert("model.norm.weight".into(), w);
    });
    assert_eq!(load_err(d.path()), "tensor `model.norm.weight` holds 2 non-finite values");
}

#[test]
fn bad_config_values_name_field_expected_and_actual() {
    let d = copy_gdn();
    edit_config(d.path(), |v| v["num_v_heads"] = 3.into());
    assert_eq!(load_err(d.path()), "config.json: invalid `num_v_heads`: expected a positive multiple of num_heads (2), got 3");
    edit_config(d.path(), |v| {
        v["num_v_heads"] = serde_json::Value::Null;
        v["head_dim"] = "big".into();
    });
    let e = load_err(d.path());
    assert!(e.starts_with("config.json: ") && e.contains("invalid type: string \"big\""), "{e}");
    edit_config(d.path(), |v| v["head_dim"] = 16.into());
    // The first tensor whose shape depends on head_dim is the q conv.
    assert_eq!(load_err(d.path()), "tensor `model.layers.0.attn.q_conv1d.weight` has shape [64, 1, 4], expected [32, 1, 4]");
}

#[test]
fn unsupported_architectures_are_refused() {
    let d = copy_gdn();
    edit_config(d.path(), |v| v["model_type"] = "mamba2".into());
    assert_eq!(
        load_err(d.path()),
        "config.json: unsupported `model_type` = mamba2; supported: `gated_deltanet`, `gated_deltaproduct`, `delta_net`, `qwen3_5`, `qwen3_5_text`, `qwen3_5_moe`, `qwen3_5_moe_text`, `qwen3_next` or `olmo_hybrid`"
    );
    // A config that calls layer 1 attention, over a checkpoint whose layer 1 is not.
    edit_config(d.path(), |v| {
        v["model_type"] = "gated_deltanet".into();
        v["attn"] = serde_json::json!({"layers": [1], "num_heads": 2});
    });
    assert_eq!(load_err(d.path()), "tensor `model.layers.1.attn.v_proj.weight` has shape [96, 64], expected [64, 64]");
    edit_config(d.path(), |v| v["attn"] = serde_json::json!({"layers": [2], "num_heads": 2}));
    let e = load_err(d.path());
    assert!(e.contains("`attn.layers`") && e.contains("below num_hidden_layers (2)"), "{e}");
    edit_config(d.path(), |v| {
        v["attn"] = serde_json::Value::Null;
        v["hidden_act"] = "powlu".into();
    });
    assert_eq!(load_err(d.path()), "config.json: unsupported `hidden_act` = powlu; supported: `swish`");
    edit_config(d.path(), |v| {
        v["hidden_act"] = "swish".into();
        v["attnres_block_size"] = 8.into();
    });
    assert_eq!(load_err(d.path()), "config.json: unsupported `attnres_block_size` = 8; supported: null");
}

#[test]
fn missing_checkpoint_files_are_named() {
    let d = copy_gdn();
    std::fs::remove_file(d.path().join("model.safetensors")).unwrap();
    let e = load_err(d.path());
    assert!(e.contains("model.safetensors") && e.contains("No such file"), "{e}");
    let e = load_err(Path::new("no/such/dir/at/all"));
    assert!(e.contains("`model`") && e.contains("no/such/dir/at/all"), "{e}");
}

#[test]
fn tokenizer_larger_than_vocab_is_refused() {
    let d = copy_gdn();
    edit_config(d.path(), |v| v["vocab_size"] = 100.into());
    rewrite_tensors(d.path(), |t| {
        for k in ["model.embeddings.weight", "lm_head.weight"] {
            let w = t[k].narrow(0, 0, 100).unwrap();
            t.insert(k.into(), w);
        }
    });
    assert_eq!(load_err(d.path()), "tokenizer: tokenizer.json has 512 tokens but config.json `vocab_size` is 100");
}

#[test]
fn legacy_layouts_load_and_agree() {
    // Split the current layout into the legacy forms (§1.5 fused MLP + attn.D, §2.4 lists)
    // and check the logits do not change.
    use deltaserve_engine::{Logits, PrefillAlgo};
    for (name, legacy) in [("gdn", legacy_gdn as fn(&mut HashMap<String, Tensor>)), ("gdp", legacy_gdp)] {
        let d = tempfile::tempdir().unwrap();
        for e in std::fs::read_dir(compact_dir().join(name)).unwrap() {
            let e = e.unwrap();
            std::fs::copy(e.path(), d.path().join(e.file_name())).unwrap();
        }
        let run = |dir: &Path| {
            let eng = Engine::load(&LoadOptions::cpu(dir.to_str().unwrap())).unwrap();
            let mut pool = eng.new_pool(1).unwrap();
            let s = pool.allocate().unwrap();
            let l = eng.model().prefill(&mut pool, s, &[1, 5, 9, 200, 3, 7], Logits::All, PrefillAlgo::Chunked).unwrap();
            deltaserve_tests::values(&l)
        };
        let before = run(d.path());
        rewrite_tensors(d.path(), legacy);
        assert_eq!(run(d.path()), before, "{name}: legacy layout changed the logits");
    }
}

fn legacy_gdn(t: &mut HashMap<String, Tensor>) {
    for l in 0..2 {
        let p = format!("model.layers.{l}");
        let g = t.remove(&format!("{p}.mlp.gate_proj.weight")).unwrap();
        let u = t.remove(&format!("{p}.mlp.up_proj.weight")).unwrap();
        t.insert(format!("{p}.mlp.gate_proj.weight"), Tensor::cat(&[g, u], 0).unwrap());
        t.insert(format!("{p}.attn.D"), Tensor::ones(2, candle_core::DType::F32, &Device::Cpu).unwrap());
    }
}

fn legacy_gdp(t: &mut HashMap<String, Tensor>) {
    let n = 2;
    for l in 0..2 {
        let p = format!("model.layers.{l}.attn");
        for name in ["k_proj", "v_proj", "b_proj", "k_conv1d", "v_conv1d"] {
            let w = t.remove(&format!("{p}.{name}.weight")).unwrap();
            let part = w.dim(0).unwrap() / n;
            for j in 0..n {
                t.insert(format!("{p}.{name}s.{j}.weight"), w.narrow(0, j * part, part).unwrap());
            }
        }
        let q = t.remove(&format!("{p}.q_conv1d.weight")).unwrap();
        t.insert(format!("{p}.q_conv1ds.0.weight"), q.clone());
        // Unused by fla: must be ignored.
        t.insert(format!("{p}.q_conv1ds.1.weight"), (q * 3.0).unwrap());
    }
}

#[test]
fn offline_hub_miss_names_repo_and_cache() {
    let home = tempfile::tempdir().unwrap();
    std::env::set_var("HF_HOME", home.path());
    std::env::set_var("HF_HUB_OFFLINE", "1");
    let e = Engine::load(&LoadOptions::cpu("some-org/some-model@v2")).unwrap_err().to_string();
    let cache = home.path().join("hub");
    assert_eq!(
        e,
        format!("`some-org/some-model@v2` is not in the Hugging Face cache at {} and HF_HUB_OFFLINE is set; download it first or unset HF_HUB_OFFLINE", cache.display())
    );
}

#[test]
fn state_dtypes_the_device_cannot_keep_are_refused() {
    // bf16 states are a GPU option; f16 states no kernel takes.
    let dir = compact_dir().join("gdn");
    for dtype in [candle_core::DType::BF16, candle_core::DType::F16] {
        let opts = LoadOptions { state_dtype: dtype, ..LoadOptions::cpu(dir.to_str().unwrap()) };
        let e = Engine::load(&opts).unwrap_err().to_string();
        assert_eq!(e, format!("invalid `state_dtype`: expected f32, or bf16 on a GPU, got {dtype:?} on the CPU"));
    }
}

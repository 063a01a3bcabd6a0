//! The `deltaserve` binary's subcommands, run as a user would.

use std::process::Command;

use deltaserve_tests::compact_dir;

fn deltaserve(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_deltaserve")).args(args).env("DELTASERVE_LOG", "warn").output().unwrap()
}

#[test]
fn generate_is_reproducible_for_a_seed() {
    let model = compact_dir().join("gdp");
    let args = [
        "generate",
        "--model",
        model.to_str().unwrap(),
        "--prompt",
        "def f(x):",
        "--max-tokens",
        "24",
        "--seed",
        "42",
        "--temperature",
        "0.9",
    ];
    let a = deltaserve(&args);
    let b = deltaserve(&args);
    assert!(a.status.success(), "{}", String::from_utf8_lossy(&a.stderr));
    let text = String::from_utf8(a.stdout.clone()).expect("stdout is UTF-8");
    assert!(text.starts_with("def f(x):"), "{text}");
    assert!(text.len() > "def f(x):\n".len(), "nothing generated: {text:?}");
    assert_eq!(a.stdout, b.stdout, "same seed, different text");
}

#[test]
fn greedy_generate_matches_the_goldens_text() {
    // compact/gdn case 0: the goldens' greedy continuation, decoded, is what we print.
    let model = compact_dir().join("gdn");
    let cases = deltaserve_tests::golden_cases(&compact_dir().join("gdn.goldens.json"));
    let case = &cases[0];
    let steps = case.top2_margins.iter().take_while(|&&m| m >= 1e-3).count();
    let out = deltaserve(&[
        "generate",
        "--model",
        model.to_str().unwrap(),
        "--prompt",
        &case.prompt,
        "--max-tokens",
        &steps.to_string(),
        "--temperature",
        "0",
        "--ignore-eos",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let engine = deltaserve_engine::Engine::load(&deltaserve_engine::LoadOptions::cpu(model.to_str().unwrap())).unwrap();
    let want = engine.tokenizer().decode(&case.greedy_new_ids[..steps], true).unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), format!("{}{}\n", case.prompt, want));
}

#[test]
fn eval_ppl_prints_json() {
    let model = compact_dir().join("gdn");
    let text = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(text.path(), "def add(a, b):\n    return a + b\n".repeat(20)).unwrap();
    let out = deltaserve(&["eval", "ppl", "--model", model.to_str().unwrap(), "--text", text.path().to_str().unwrap(), "--seq-len", "64"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let ppl = v["ppl"].as_f64().unwrap();
    assert!(ppl.is_finite() && ppl > 1.0, "{v}");
    assert!(v["tokens"].as_u64().unwrap() > 100, "{v}");
}

#[test]
fn bad_arguments_fail_with_a_message() {
    let out = deltaserve(&["generate", "--model", "/nonexistent/dir", "--prompt", "x"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("`model`") && err.contains("/nonexistent/dir"), "{err}");
    let model = compact_dir().join("gdn");
    let out = deltaserve(&["generate", "--model", model.to_str().unwrap(), "--prompt", "x", "--top-p", "1.5"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("`top_p`") && err.contains("1.5"), "{err}");
    // A served model name clients could not send is refused before anything loads.
    let out = deltaserve(&["serve", "--model", model.to_str().unwrap(), "--served-model-name", ""]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--served-model-name") && err.contains("must not be empty"), "{err}");
    // The tokenizer cache takes bytes, not a fraction of the device.
    let out = deltaserve(&["serve", "--model", model.to_str().unwrap(), "--tokenizer-cache-memory", "0.5"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--tokenizer-cache-memory") && err.contains("expected bytes") && err.contains("0.5"), "{err}");
    // Step budgets below one prefill chunk are refused, naming the flag, the bound and the value.
    for (flag, value) in [("--max-num-batched-tokens", "32"), ("--long-prefill-chunk", "10")] {
        let out = deltaserve(&["serve", "--model", model.to_str().unwrap(), flag, value]);
        assert!(!out.status.success(), "{flag} {value}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(flag) && err.contains(">= 64") && err.contains(&format!("got {value}")), "{err}");
    }
}

#[test]
fn generate_on_the_default_demo_model_decodes_cleanly() {
    // No --model: the bundled Gated DeltaNet demo is the default.
    let out = deltaserve(&["generate", "--prompt", "def fibonacci(n):", "--max-tokens", "40", "--seed", "3"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).expect("output is valid UTF-8");
    assert!(!text.contains('\u{FFFD}'), "replacement character in {text:?}");
    let generated = text.trim_end_matches('\n').strip_prefix("def fibonacci(n):").expect("prompt echoed first");
    assert!(!generated.is_empty());
    // The text tokenizes back into valid ids of the model's vocabulary and round-trips.
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/gdn-demo");
    let engine = deltaserve_engine::Engine::load(&deltaserve_engine::LoadOptions::cpu(dir.to_str().unwrap())).unwrap();
    let ids = engine.tokenizer().encode(generated, false).unwrap();
    assert!(!ids.is_empty());
    assert!(ids.iter().all(|&i| (i as usize) < engine.config().common.vocab_size));
    assert_eq!(engine.tokenizer().decode(&ids, false).unwrap(), generated);
}

/// Copies every file of `src` into `dst`.
fn copy_dir(src: &std::path::Path, dst: &std::path::Path) {
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(src).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dst.join(e.file_name())).unwrap();
    }
}

#[test]
fn the_prune_command_of_the_brief_works_verbatim() {
    // `deltaserve prune --method drrqr --ratio 0.5 ckpt/`, exactly, in a directory holding a
    // copy of a committed fixture: the default output is `ckpt-drrqr-0.5/` beside it, calibrated
    // on the bundled text.
    let tmp = tempfile::tempdir().unwrap();
    copy_dir(&compact_dir().join("gdn"), &tmp.path().join("ckpt"));
    let out = Command::new(env!("CARGO_BIN_EXE_deltaserve"))
        .current_dir(tmp.path())
        .args(["prune", "--method", "drrqr", "--ratio", "0.5", "ckpt/"])
        .env("DELTASERVE_LOG", "info")
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("bundled text"), "no log line about the default calibration: {stderr}");
    let pruned = tmp.path().join("ckpt-drrqr-0.5");
    assert!(stdout.contains("ckpt-drrqr-0.5"), "the output directory is not printed: {stdout}");
    let before = deltaserve_engine::read_config(&tmp.path().join("ckpt")).unwrap();
    let after = deltaserve_engine::read_config(&pruned).unwrap();
    assert_eq!(after.head_k_dim(), before.head_k_dim() / 2);
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(pruned.join("pruning_report.json")).unwrap()).unwrap();
    assert_eq!(report["method"], "drrqr");
    assert!(report["calibration_tokens"].as_u64().unwrap() >= 2048, "{report}");
    let engine = deltaserve_engine::Engine::load(&deltaserve_engine::LoadOptions::cpu(pruned.to_str().unwrap())).unwrap();
    assert_eq!(engine.config().head_k_dim(), after.head_k_dim());
}

#[test]
fn a_closed_stdout_ends_subcommands_quietly() {
    // `deltaserve ... | head -c 0`: stdout is closed before anything is written.
    let model = compact_dir().join("gdn");
    let model = model.to_str().unwrap();
    let text = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(text.path(), "def f(x):\n    return x + 1\n".repeat(20)).unwrap();
    let runs: [&[&str]; 2] = [
        &["eval", "ppl", "--model", model, "--text", text.path().to_str().unwrap(), "--seq-len", "64"],
        &["generate", "--model", model, "--prompt", "def f(x):", "--max-tokens", "64"],
    ];
    for args in runs {
        let mut child = Command::new(env!("CARGO_BIN_EXE_deltaserve"))
            .args(args)
            .env("DELTASERVE_LOG", "warn")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{}: {stderr}", args[0]);
        assert!(out.status.success(), "{}: exit {:?}: {stderr}", args[0], out.status);
    }
}

#[test]
fn init_random_writes_fla_attention_hybrids_and_refuses_bad_configs() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("hybrid");
    let cfg = dir.path().join("config.json");
    // fla's Gated DeltaNet with two windowed attention layers (biased q/k/v), as fla writes
    // such a config; the demo tokenizer's 4,096 tokens.
    let hybrid = serde_json::json!({
        "model_type": "gated_deltanet", "architectures": ["GatedDeltaNetForCausalLM"], "hidden_size": 64,
        "num_hidden_layers": 3, "vocab_size": 4096, "hidden_ratio": 4, "conv_size": 4, "use_gate": true,
        "use_short_conv": true, "norm_eps": 1e-6, "fuse_norm": true, "tie_word_embeddings": false, "num_heads": 2,
        "head_dim": 16, "expand_v": 2,
        "attn": {"layers": [1, 2], "num_heads": 4, "num_kv_heads": 2, "qkv_bias": true, "window_size": 8, "rope_theta": 10000.0}
    });
    std::fs::write(&cfg, hybrid.to_string()).unwrap();
    let demo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/gdn-demo");
    let args = ["init-random", "--config", cfg.to_str().unwrap(), "-o", out_dir.to_str().unwrap(), "--tokenizer-from"];
    let out = deltaserve(&[&args[..], &[demo.to_str().unwrap()]].concat());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let names: Vec<String> = deltaserve_engine::weights::Checkpoint::open(&out_dir).unwrap().names();
    for want in ["model.layers.1.attn.q_proj.bias", "model.layers.2.attn.o_proj.weight", "model.layers.0.attn.k_conv1d.weight"] {
        assert!(names.iter().any(|n| n == want), "{want} among {names:?}");
    }
    assert!(!names.iter().any(|n| n == "model.layers.1.attn.q_conv1d.weight"), "no short conv in an attention layer");
    let out = deltaserve(&["generate", "--model", out_dir.to_str().unwrap(), "--prompt", "hello", "--max-tokens", "8"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.starts_with("hello") && text.len() > "hello".len(), "{text:?}");
    // A config it cannot read: refused, naming the field, the expected and the actual value.
    let mut bad = hybrid.clone();
    bad["num_hidden_layers"] = serde_json::json!(0);
    std::fs::write(&cfg, bad.to_string()).unwrap();
    let out = deltaserve(&["init-random", "--config", cfg.to_str().unwrap(), "-o", dir.path().join("q").to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("num_hidden_layers") && !err.contains("panicked"), "{err}");
    assert!(!dir.path().join("q").exists(), "nothing written for a refused config");
}

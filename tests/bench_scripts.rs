//! The benchmark scripts that run on the GPU host, checked here without one: the decode A/B
//! runner (`benches/ab_decode.sh`) against a stand-in `gpu_bench`, and its summary
//! (`benches/ab_summary.py`) against a stored GPU run whose figures the device printed.

use std::path::{Path, PathBuf};
use std::process::Command;

fn benches() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../benches")
}

/// The stand-in gpu_bench ([`STUB`]) written into `dir`, executable.
fn stand_in(dir: &Path) -> PathBuf {
    let stub = dir.join("gpu_bench");
    std::fs::write(&stub, STUB).expect("write the stand-in");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&stub, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    stub
}

/// A directory `dir/name` holding a checkpoint's config, so the runner builds nothing there.
fn checkpoint_dir(dir: &Path, name: &str) -> PathBuf {
    let ckpt = dir.join(name);
    std::fs::create_dir(&ckpt).expect("mkdir");
    std::fs::write(ckpt.join("config.json"), "{}").expect("a checkpoint's config");
    ckpt
}

/// The summary of `benches/results/h200-decode_inputs-2026-11-30/call4-kept/`, three rounds of
/// HEAD (`b`) against that build (`n`). The expected cells are the call's own printout (its
/// `run.sh` summarised each log as it ran: ms to four places, and % of the roofline), rounded.
#[test]
fn the_decode_ab_summary_gives_a_stored_run_s_ranges() {
    let dir = benches().join("results/h200-decode_inputs-2026-11-30/call4-kept");
    let out = Command::new("python3").arg(benches().join("ab_summary.py")).arg(&dir).output().expect("python3 runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).expect("utf-8");
    // Qwen3.5 layout, batch 1: 1.5664 / 1.5668 / 1.5669 ms at 70.09 / 70.08 / 69.84%; batch 64:
    // 3.5710 / 3.5723 / 3.5678 ms at 68.31 / 68.19 / 68.09%.
    let q35 = text.lines().find(|l| l.starts_with("| b |")).expect("a row for b");
    assert!(q35.contains("| 1.566–1.567 ms (69.8–70.1%, 3 runs) |"), "{q35}");
    let q35_n = text.lines().find(|l| l.starts_with("| n |")).expect("a row for n");
    assert!(q35_n.ends_with("| 3.568–3.572 ms (68.1–68.3%, 3 runs) |"), "{q35_n}");
    // The 1.39B's table (its logs' prefix is `model`), batch 64 of n: 4.1440 / 4.1419 / 4.1416 ms.
    let model = &text[text.find("### model").expect("the 1.39B's table")..];
    let n = model.lines().find(|l| l.starts_with("| n |")).expect("a row for n");
    assert!(n.contains("| 4.142–4.144 ms ("), "{n}");
    assert_eq!(text.matches("### ").count(), 2, "{text}");
}

/// A stand-in for gpu_bench: the step it reports takes `$STUB_MS` ms at a roofline of 1 ms, and
/// each call appends its settings and model (a hybrid's by its directory's name) to `$STUB_TRACE`. For the 1.39B (`--model-only`) it
/// prints gpu_bench's table with figures wrong on purpose (9.99 ms, 1 token/s: the summary must
/// not read them when there are JSON lines), then the JSON lines of an eager step
/// (`$STUB_EAGER_MS`) and a CUDA-graph one at each batch, as gpu_bench does.
const STUB: &str = r#"#!/usr/bin/env bash
model=gdn; [[ " $* " == *" --hybrid-dir "* ]] && model=$(basename "$(echo "$*" | sed 's/.*--hybrid-dir \([^ ]*\).*/\1/')")
echo "$model $STUB_MS" >> "$STUB_TRACE"
batches=$(echo "$*" | sed 's/.*--batches \([0-9,]*\).*/\1/')
for b in ${batches//,/ }; do
  if [ $model != gdn ]; then
    echo "OURS {\"batch\":$b,\"ms\":$STUB_MS,\"roofline_ms\":1.0,\"what\":\"decode\"}"
  else
    echo "| $b | no | 9.99 | 1 | $((1000 * b)) | 0% |"
    echo "| $b | yes | 9.99 | 1 | $((1000 * b)) | 0% |"
  fi
done
if [ $model = gdn ]; then
  for b in ${batches//,/ }; do
    echo "OURS {\"what\":\"decode\",\"batch\":$b,\"cuda_graph\":false,\"ms\":$STUB_EAGER_MS,\"roofline_ms\":1.0}"
    echo "OURS {\"what\":\"decode\",\"batch\":$b,\"cuda_graph\":true,\"ms\":$STUB_MS,\"roofline_ms\":1.0}"
  done
fi
"#;

/// The runner alternates its variants within each round, model after model, passes each its
/// settings, names the logs as the summary reads them and summarises them: two variants, two
/// rounds, both models, against the stand-in. Where a log has JSON lines the summary takes the
/// CUDA-graph steps from them, neither the table's rounded rows nor the eager steps.
#[test]
fn the_decode_ab_runner_alternates_variants_and_summarises_them() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let stub = stand_in(tmp.path());
    let hybrid = checkpoint_dir(tmp.path(), "q35");
    let trace = tmp.path().join("trace");
    let out = tmp.path().join("out");
    let status = Command::new("bash")
        .arg(benches().join("ab_decode.sh"))
        .arg(&out)
        .arg(format!("slow=STUB_MS=2.0 {}", stub.display()))
        .arg(format!("fast=STUB_MS=1.25 {}", stub.display()))
        .env("ROUNDS", "2")
        .env("BATCHES", "4,16")
        .env("HYBRID_DIR", &hybrid)
        .env("MODEL_DIR", tmp.path().join("gdn"))
        .env("STUB_TRACE", &trace)
        .env("STUB_EAGER_MS", "4.0")
        .status()
        .expect("bash runs");
    assert!(status.success());
    let calls = std::fs::read_to_string(&trace).expect("the stand-in ran");
    let order: Vec<&str> = calls.lines().collect();
    assert_eq!(order, ["q35 2.0", "q35 1.25", "q35 2.0", "q35 1.25", "gdn 2.0", "gdn 1.25", "gdn 2.0", "gdn 1.25"]);
    let summary = std::fs::read_to_string(out.join("summary.md")).expect("summary.md");
    let q35 = &summary[summary.find("### q35").expect("q35's table")..summary.find("### gdn").expect("gdn's table")];
    assert!(q35.contains("| slow | 2.000 ms (50.0%, 2 runs) | 2.000 ms (50.0%, 2 runs) |"), "{summary}");
    assert!(q35.contains("| fast | 1.250 ms (80.0%, 2 runs) | 1.250 ms (80.0%, 2 runs) |"), "{summary}");
    let gdn = &summary[summary.find("### gdn").expect("gdn's table")..];
    assert!(gdn.contains("| batch 4 | batch 16 |"), "{summary}");
    assert!(gdn.contains("| fast | 1.250 ms (80.0%, 2 runs) | 1.250 ms (80.0%, 2 runs) |"), "{summary}");
    assert!(out.join("gdn-8-fast.log").exists(), "logs are named {{model}}-{{i}}-{{variant}}.log");
}

/// `MODELS=moe` runs the MoE layout's checkpoint (`--hybrid-dir $MOE_DIR`) and summarises it under
/// its own name; the checkpoint is there, so nothing is built.
#[test]
fn the_decode_ab_runner_takes_the_moe_layout() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let stub = stand_in(tmp.path());
    let moe = checkpoint_dir(tmp.path(), "moe");
    let (trace, out) = (tmp.path().join("trace"), tmp.path().join("out"));
    let status = Command::new("bash")
        .arg(benches().join("ab_decode.sh"))
        .arg(&out)
        .arg(format!("base=STUB_MS=1.6 {}", stub.display()))
        .arg(format!("new=STUB_MS=1.25 {}", stub.display()))
        .env("ROUNDS", "1")
        .env("BATCHES", "1,64")
        .env("MODELS", "moe")
        .env("MOE_DIR", &moe)
        .env("STUB_TRACE", &trace)
        .status()
        .expect("bash runs");
    assert!(status.success());
    let calls = std::fs::read_to_string(&trace).expect("the stand-in ran");
    assert_eq!(calls.lines().collect::<Vec<_>>(), ["moe 1.6", "moe 1.25"]);
    assert!(!out.join("build_moe.log").exists(), "an existing checkpoint is not rebuilt");
    let summary = std::fs::read_to_string(out.join("summary.md")).expect("summary.md");
    assert!(summary.contains("### moe"), "{summary}");
    assert!(summary.contains("| new | 1.250 ms (80.0%, 1 runs) | 1.250 ms (80.0%, 1 runs) |"), "{summary}");
}

/// `benches/ncu_median.py` on a stored Nsight Compute CSV
/// (`results/h200-conv_prep-2026-12-02/call4-ftz/`), whose table follows the profiled program's
/// own output. The expected medians were read off the file's rows by hand: the fused conv + prep's
/// six durations 64,768 / 64,992 / 65,536 / 65,568 / 66,048 / 66,528 ns, SwiGLU's eight from
/// 34,752 to 36,512 (the fifth 35,232), the gated norm's six (the fourth 44,448).
#[test]
fn the_ncu_median_script_reads_a_stored_profile() {
    let csv = benches().join("results/h200-conv_prep-2026-12-02/call4-ftz/ncu_q35_b139_fused.csv");
    let out = Command::new("python3").arg(benches().join("ncu_median.py")).arg(&csv).arg("q35").output().expect("python3 runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).expect("utf-8");
    let line = |kernel: &str| text.lines().find(|l| l.contains(kernel)).unwrap_or_else(|| panic!("no {kernel} in {text}")).to_string();
    assert!(line("conv_prep_bf16_narrow_k128_r8_b1").contains("n=6 median 65568 ns"), "{text}");
    assert!(line("swiglu_bf16_vec").contains("n=8 median 35232 ns"), "{text}");
    assert!(line("gated_rms_norm_xbf16_bf16_bf16_k4").contains("n=6 median 44448 ns"), "{text}");
    assert!(line("conv_prep_bf16_narrow_k128_r8_b1").ends_with("regs 66"), "{text}");
    assert_eq!(text.lines().count(), 3, "{text}");
}

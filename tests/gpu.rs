//! GPU tests (CUDA backend): our kernels against the CPU reference and fla's goldens, and the
//! properties continuous batching relies on. They need a build with `--features cuda` and a
//! CUDA device; elsewhere the binary prints `SKIPPED (GPU)` with the reason and checks nothing.
//! It has its own `main` (no libtest) so that the notice is never swallowed by output capture.
//! Run on a GPU host: `cargo test -p deltaserve-tests --features cuda --test gpu [FILTER]`.

use candle_core::{DType, Device, Tensor};
use deltaserve_engine::{Engine, LoadOptions, Logits};
use deltaserve_kernels::ops::{gated_delta_prefill, MixerInputs, PrefillAlgo};
use deltaserve_kernels::SlotBuffer;
use deltaserve_tests::{
    check_greedy, check_op_case, compact_dir, golden_cases, load_tensors, model_fixtures, packed_model_prefill_error, prune_half, rel_err,
    shared_dir, values, GREEDY_MARGIN,
};
use rand::{Rng, SeedableRng};

/// A GPU test: its name and body.
type GpuTest = (&'static str, fn(&Device));

// Calls the CUDA kernels' launchers directly (every B they take, not only those the ops pick).
#[cfg(feature = "cuda")]
#[path = "gpu/conv_prep.rs"]
mod conv_prep;
#[cfg(feature = "cuda")]
#[path = "gpu/gemm.rs"]
mod gemm;
#[path = "gpu/host_tier.rs"]
mod host_tier;
#[path = "gpu/mixer.rs"]
mod mixer;
#[cfg(feature = "cuda")]
#[path = "gpu/norm_gemv.rs"]
mod norm_gemv;
#[path = "gpu/ops.rs"]
mod ops;
#[path = "gpu/prefill_graph.rs"]
mod prefill_graph;
#[path = "gpu/sampling.rs"]
mod sampling;
#[path = "gpu/serving_script.rs"]
mod serving_script;
#[cfg(feature = "cuda")]
#[path = "gpu/skinny.rs"]
mod skinny;
#[path = "gpu/state_dtype.rs"]
mod state_dtype;
#[cfg(feature = "nccl")]
#[path = "gpu/tensor_parallel.rs"]
mod tensor_parallel;
#[path = "gpu/warmup.rs"]
mod warmup;

const TESTS: &[GpuTest] = &[
    #[cfg(feature = "cuda")]
    ("gpu_gemm_matches_cpu", gemm::gpu_gemm_matches_cpu),
    #[cfg(feature = "cuda")]
    ("gpu_tuned_gemm_gives_the_heuristics_bits", gemm::gpu_tuned_gemm_gives_the_heuristics_bits),
    #[cfg(feature = "cuda")]
    ("gpu_gemm_f32_output_is_the_unrounded_product", gemm::gpu_gemm_f32_output_is_the_unrounded_product),
    #[cfg(feature = "cuda")]
    ("gpu_split_projection_slices_sum_to_the_product", gemm::gpu_split_projection_slices_sum_to_the_product),
    #[cfg(feature = "cuda")]
    ("gpu_split_projections_leave_a_models_logits", gemm::gpu_split_projections_leave_a_models_logits),
    #[cfg(feature = "cuda")]
    ("gpu_skinny_gemm_matches_cpu", skinny::gpu_skinny_gemm_matches_cpu),
    #[cfg(feature = "cuda")]
    ("gpu_skinny_swiglu_equals_gemm_then_swiglu", skinny::gpu_skinny_swiglu_equals_gemm_then_swiglu),
    #[cfg(feature = "cuda")]
    ("gpu_skinny_conv_equals_gemm_then_conv_step", skinny::gpu_skinny_conv_equals_gemm_then_conv_step),
    #[cfg(feature = "cuda")]
    ("gpu_norm_folded_into_gemv_equals_two_kernels", norm_gemv::gpu_norm_folded_into_gemv_equals_two_kernels),
    #[cfg(feature = "cuda")]
    ("gpu_gated_norm_folded_into_gemv_equals_two_kernels", norm_gemv::gpu_gated_norm_folded_into_gemv_equals_two_kernels),
    #[cfg(feature = "cuda")]
    ("gpu_swiglu_folded_into_gate_up_equals_two_kernels", norm_gemv::gpu_swiglu_folded_into_gate_up_equals_two_kernels),
    #[cfg(feature = "cuda")]
    ("gpu_conv_folded_into_projection_equals_two_kernels", norm_gemv::gpu_conv_folded_into_projection_equals_two_kernels),
    ("gpu_sampling_matches_cpu", sampling::gpu_sampling_matches_cpu),
    ("gpu_sampling_follows_the_distribution", sampling::gpu_sampling_follows_the_distribution),
    ("gpu_prefix_cache_snapshots_match_whole_prefills", gpu_prefix_cache_snapshots_match_whole_prefills),
    ("gpu_batch_invariant_mode_logits_do_not_depend_on_the_batch", gpu_batch_invariant_mode_logits_do_not_depend_on_the_batch),
    ("gpu_sparse_moe_matches_cpu", ops::gpu_sparse_moe_matches_cpu),
    ("gpu_paged_attention_matches_cpu", ops::gpu_paged_attention_matches_cpu),
    ("gpu_ops_match_reference", gpu_ops_match_reference),
    ("gpu_conv_and_swiglu_match_cpu", ops::gpu_conv_and_swiglu_match_cpu),
    #[cfg(feature = "cuda")]
    ("gpu_conv_prep_equals_conv_then_prep", conv_prep::gpu_conv_prep_equals_conv_then_prep),
    ("gpu_prep_and_gated_norm_match_cpu", ops::gpu_prep_and_gated_norm_match_cpu),
    ("gpu_gated_norm_reads_bf16_rows_as_their_widening", ops::gpu_gated_norm_reads_bf16_rows_as_their_widening),
    ("gpu_prefill_row_kernels_equal_decode_variants", ops::gpu_prefill_row_kernels_equal_decode_variants),
    #[cfg(feature = "cuda")]
    ("gpu_small_batch_linear_matches_cpu", ops::gpu_small_batch_linear_matches_cpu),
    ("gpu_models_match_cpu_and_goldens", gpu_models_match_cpu_and_goldens),
    ("gpu_bf16_states_follow_the_goldens", state_dtype::gpu_bf16_states_follow_the_goldens),
    ("gpu_packed_prefill_equals_prefilling_each_alone", mixer::gpu_packed_prefill_equals_prefilling_each_alone),
    ("gpu_decode_in_any_slot_order_equals_each_alone", mixer::gpu_decode_in_any_slot_order_equals_each_alone),
    ("gpu_raw_decode_step_equals_prepare_then_step", mixer::gpu_raw_decode_step_equals_prepare_then_step),
    (
        "gpu_batch_invariant_mode_decode_step_rows_do_not_depend_on_the_batch",
        mixer::gpu_batch_invariant_mode_decode_step_rows_do_not_depend_on_the_batch,
    ),
    ("gpu_packed_model_prefill_equals_each_alone", gpu_packed_model_prefill_equals_each_alone),
    ("gpu_mixed_passes_equal_separate_passes", gpu_mixed_passes_equal_separate_passes),
    ("gpu_last_row_logits_equal_the_whole_pass_last_row", gpu_last_row_logits_equal_the_whole_pass_last_row),
    ("gpu_pruning_calibration_matches_the_cpu", gpu_pruning_calibration_matches_the_cpu),
    ("gpu_chunk_boundaries_match_cpu", mixer::gpu_chunk_boundaries_match_cpu),
    ("gpu_paired_prep_equals_one_head_a_cta", mixer::gpu_paired_prep_equals_one_head_a_cta),
    ("gpu_warpgroup_state_pass_matches_cpu", mixer::gpu_warpgroup_state_pass_matches_cpu),
    ("gpu_warpgroup_prep_equals_tc_prep", mixer::gpu_warpgroup_prep_equals_tc_prep),
    ("gpu_two_warpgroup_pass_equals_one", mixer::gpu_two_warpgroup_pass_equals_one),
    ("gpu_decode_graphs_equal_eager_decode", gpu_decode_graphs_equal_eager_decode),
    ("gpu_prefill_graphs_equal_eager_prefill", prefill_graph::gpu_prefill_graphs_equal_eager_prefill),
    ("gpu_mixed_graphs_equal_eager_mixed_passes", prefill_graph::gpu_mixed_graphs_equal_eager_mixed_passes),
    ("gpu_serving_script_matches_cpu", serving_script::gpu_serving_script_matches_cpu),
    ("gpu_warm_up_leaves_the_pool_as_it_was", warmup::gpu_warm_up_leaves_the_pool_as_it_was),
    ("gpu_host_tier_round_trips_snapshots_exactly", host_tier::gpu_host_tier_round_trips_snapshots_exactly),
    #[cfg(feature = "nccl")]
    ("gpu_tensor_parallel_equals_one_gpu", tensor_parallel::gpu_tensor_parallel_equals_one_gpu),
    #[cfg(feature = "nccl")]
    ("gpu_tensor_parallel_host_tier_round_trips", host_tier::gpu_tensor_parallel_host_tier_round_trips),
];

fn main() {
    // Arguments that are not flags filter tests by substring (libtest flags are ignored).
    let filters: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    let selected: Vec<_> =
        TESTS.iter().filter(|(name, _)| filters.is_empty() || filters.iter().any(|f| name.contains(f.as_str()))).collect();
    let dev = if !cfg!(feature = "cuda") {
        Err("built without `--features cuda`".to_owned())
    } else {
        deltaserve_engine::parse_device("cuda").map_err(|e| format!("no usable CUDA device ({e})"))
    };
    let dev = match dev {
        Ok(d) => d,
        Err(why) => {
            println!("SKIPPED (GPU): {} GPU tests not run: {why}", selected.len());
            return;
        }
    };
    let mut failed = Vec::new();
    for (name, test) in &selected {
        println!("test {name} ...");
        match std::panic::catch_unwind(|| test(&dev)) {
            Ok(()) => println!("test {name} ... ok"),
            Err(_) => {
                println!("test {name} ... FAILED");
                failed.push(*name);
            }
        }
    }
    println!("GPU tests: {} passed, {} failed {failed:?}", selected.len() - failed.len(), failed.len());
    if !failed.is_empty() {
        std::process::exit(1);
    }
}

/// Turns the batch-invariant mode off when dropped, so that a test that fails with it on leaves
/// it off for the tests after it.
struct BatchInvariantOff;
impl Drop for BatchInvariantOff {
    fn drop(&mut self) {
        deltaserve_kernels::ops::set_batch_invariant(false);
    }
}

const F32_TOL: f64 = 1e-4;
const BF16: DType = DType::BF16;
const BF16_TOL: f64 = 2e-2;
/// OLMo-Hybrid's compact fixtures in bf16 are ill-conditioned: transformers' own bf16 forward
/// lands 0.34–0.73 from its f32 goldens on the NoPE one and up to 3.3e-2 on the RoPE one
/// (`tools/reference_bf16_error.py`). Ours measured up to 1.0e-1 on the GPU and 3.5e-2 on the
/// CPU; f32 parity (1e-4) is the check that binds there.
const BF16_POST_NORM_TOL: f64 = 0.15;

/// The MoE fixtures' bf16 bound: 1.5× the worst of transformers' own bf16 forward against its
/// f32 goldens over the fixture's cases (stored in the goldens by
/// `tools/reference_bf16_error.py --write`: 1.6e-1 for `qwen3_next`, 7.6e-2 for `qwen3_5_moe`),
/// never below `BF16_TOL`. In bf16 a near-tie of router probabilities can pick another expert,
/// in the reference as in ours but not on the same tokens, so the error jumps case by case; the
/// f32 bound is the check that binds.
fn moe_bf16_bounds(goldens: &std::path::Path) -> Option<Vec<f64>> {
    let g: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(goldens).ok()?).ok()?;
    let errs = g.get("reference_bf16_last_rel_err")?.as_array()?;
    let worst = errs.iter().filter_map(serde_json::Value::as_f64).fold(0.0, f64::max);
    Some(vec![(1.5 * worst).max(BF16_TOL); errs.len()])
}
/// The bound on a bf16 model's last logits against the f32 goldens for case `case` of fixture
/// `name`: the MoE fixtures' [`moe_bf16_bounds`], OLMo-Hybrid's [`BF16_POST_NORM_TOL`], else
/// [`BF16_TOL`].
fn bf16_bound(name: &str, goldens: &std::path::Path, case: usize) -> f64 {
    match moe_bf16_bounds(goldens) {
        Some(b) => b[case],
        None if name.contains("olmo_hybrid") => BF16_POST_NORM_TOL,
        None => BF16_TOL,
    }
}

/// bf16 models with `--mixer-precision bf16` (every mixer matmul operand a single bf16, as fla
/// computes): opt-in, measured up to 3.8e-2 on the fixtures, so it does not meet `BF16_TOL`.
const BF16_MIXER_TOL: f64 = 5e-2;

/// The MoE fixtures' bound for a bf16 model with the bf16 mixer: 1.5× the worst of transformers'
/// own bf16 forward against its f32 goldens over every MoE fixture of `goldens`' directory (Qwen3-Next's and
/// Qwen3.5-MoE's routers are the same softmax top-k over bf16 logits). In bf16 those logits tie
/// exactly at the k-th expert on about 2% of a compact fixture's routing decisions (18 of 800 on
/// `qwen3_5_moe`'s case 4 on the CPU), and the two mixer precisions route 5 of those 800
/// differently, so a flip near the last token lands on some case of either fixture: the
/// reference's own reach 0.16 (`qwen3_next` case 1). The f32 bound is the check that binds.
fn moe_bf16_mixer_bound(goldens: &std::path::Path) -> Option<f64> {
    moe_bf16_bounds(goldens)?;
    let dir = goldens.parent()?;
    let worst = std::fs::read_dir(dir).ok()?.filter_map(|e| moe_bf16_bounds(&e.ok()?.path())).flatten().fold(0.0, f64::max);
    Some(worst)
}

fn gpu_ops_match_reference(dev: &Device) {
    let mut files = vec![compact_dir().join("ops.safetensors")];
    files.extend(shared_dir("gpu_ops_match_reference").map(|d| d.join("ops.safetensors")));
    for file in files {
        for (case, dtype) in
            [("gdr", DType::F32), ("gdr_neg", DType::F32), ("gdp", DType::F32), ("gdr", BF16), ("gdr_neg", BF16), ("gdp", BF16)]
        {
            let (eo, eh) = check_op_case(&file, case, |x, h0| {
                let to = |t: &Tensor| t.to_device(dev).unwrap();
                let qkv = |t: &Tensor| to(t).to_dtype(dtype).unwrap();
                let (q, k, v, beta, g) = (qkv(x.q), qkv(x.k), qkv(x.v), to(x.beta), x.g.map(to));
                let mut states = SlotBuffer::zeros_on(2, h0.len(), dev).unwrap();
                states.write_slot(1, &h0).unwrap();
                let inputs = MixerInputs { q: &q, k: &k, v: &v, beta: &beta, g: g.as_ref(), ..x };
                let o = gated_delta_prefill(inputs, &mut states, 1, PrefillAlgo::Chunked).unwrap();
                (values(&o), states.slot_to_vec(1).unwrap())
            });
            let (kernel, tol) = if dtype == BF16 { ("bf16 q/k/v", BF16_TOL) } else { ("f32 q/k/v", F32_TOL) };
            println!("GPU {} {case} ({kernel}): o rel err {eo:.2e}, ht rel err {eh:.2e}", file.display());
            assert!(eo <= tol && eh <= tol, "{case} {kernel}: o {eo:.3e}, ht {eh:.3e}");
        }
    }
}

fn gpu_models_match_cpu_and_goldens(_dev: &Device) {
    for (name, dir, goldens, logits_file) in model_fixtures("gpu_models_match_cpu_and_goldens") {
        let load = |device: &str, dtype: DType, prefill_algo: PrefillAlgo| {
            let opts = LoadOptions {
                model: dir.to_string_lossy().into(),
                dtype,
                state_dtype: DType::F32,
                device: deltaserve_engine::parse_device(device).unwrap(),
                check_weights: false,
                prefill_algo,
                cuda_graphs: true,
                prefill_graph_tokens: deltaserve_engine::DEFAULT_PREFILL_GRAPH_TOKENS,
                mixed_graph_tokens: deltaserve_engine::DEFAULT_MIXED_GRAPH_TOKENS,
                batch_invariant: false,
                tensor_parallel_size: 1,
                expert_split: Default::default(),
            };
            Engine::load(&opts).unwrap()
        };
        let cpu = load("cpu", DType::F32, PrefillAlgo::Chunked);
        let gpu32 = load("cuda", DType::F32, PrefillAlgo::Chunked);
        let gpu16 = load("cuda", DType::BF16, PrefillAlgo::Chunked);
        // bf16 with the mixer at fla's precision too (`--mixer-precision bf16`).
        let gpu16_fast = load("cuda", DType::BF16, PrefillAlgo::ChunkedBf16);
        let reference = load_tensors(&logits_file);
        let (mut pc, mut pg, mut pb) = (cpu.new_pool(1).unwrap(), gpu32.new_pool(2).unwrap(), gpu16.new_pool(1).unwrap());
        let mut pf = gpu16_fast.new_pool(1).unwrap();
        for (i, case) in golden_cases(&goldens).iter().enumerate() {
            let golden = values(&reference[&format!("case{i}.last_logits")]);
            let (sc, sg, sb, sf) = (pc.allocate().unwrap(), pg.allocate().unwrap(), pb.allocate().unwrap(), pf.allocate().unwrap());
            let lc = cpu.prefill(&mut pc, sc, &case.input_ids, Logits::Last).unwrap();
            let lg = gpu32.prefill(&mut pg, sg, &case.input_ids, Logits::Last).unwrap();
            let lb = gpu16.prefill(&mut pb, sb, &case.input_ids, Logits::Last).unwrap();
            let lf = gpu16_fast.prefill(&mut pf, sf, &case.input_ids, Logits::Last).unwrap();
            let (e_cpu, e_gold, e_bf16) =
                (rel_err(&values(&lg), &values(&lc)), rel_err(&values(&lg), &golden), rel_err(&values(&lb), &golden));
            let e_fast = rel_err(&values(&lf), &golden);
            println!(
                "{name} case{i}: GPU f32 vs CPU {e_cpu:.2e}, vs fla {e_gold:.2e}; GPU bf16 vs fla {e_bf16:.2e}, with the bf16 mixer {e_fast:.2e}"
            );
            assert!(e_cpu <= F32_TOL && e_gold <= F32_TOL, "{name} case{i}: f32 {e_cpu:.3e} / {e_gold:.3e}");
            let bf16_tol = bf16_bound(&name, &goldens, i);
            assert!(e_bf16 <= bf16_tol, "{name} case{i}: bf16 {e_bf16:.3e} (bound {bf16_tol:.3e})");
            let mixer_tol = moe_bf16_mixer_bound(&goldens).unwrap_or(bf16_tol).max(BF16_MIXER_TOL);
            assert!(e_fast <= mixer_tol, "{name} case{i}: bf16 with the bf16 mixer {e_fast:.3e} (bound {mixer_tol:.3e})");
            pf.release(sf).unwrap();
            if let Some(all_ref) = reference.get(&format!("case{i}.all_logits")) {
                let s2 = pg.allocate().unwrap();
                let all = gpu32.prefill(&mut pg, s2, &case.input_ids, Logits::All).unwrap();
                let e = rel_err(&values(&all), &values(all_ref));
                println!("{name} case{i}: GPU f32 all_logits vs fla {e:.2e}");
                assert!(e <= F32_TOL, "{name} case{i}: all_logits {e:.3e}");
                pg.release(s2).unwrap();
            }
            // Greedy decode on the GPU, up to the first near-tie of the goldens.
            check_greedy(&format!("{name} case{i} GPU"), case, lg, |t| gpu32.decode(&mut pg, &[(sg, t)]).unwrap().squeeze(0).unwrap());
            pc.release(sc).unwrap();
            pg.release(sg).unwrap();
            pb.release(sb).unwrap();
        }
    }
}

/// The scheduler's packed prefill (several prompts in one pass, one varlen kernel launch) equals
/// prefilling each alone, through the whole model on the GPU. In f32 the bound is the parity
/// bound: the projections' GEMMs see different row counts, and cuBLAS may pick kernels with
/// other summation orders for them (seen: up to 1.6e-5).
fn gpu_packed_model_prefill_equals_each_alone(_dev: &Device) {
    for (name, dir, _, _) in model_fixtures("gpu_packed_model_prefill_equals_each_alone") {
        // bf16 states: the same bound as bf16 models with f32 states (a state is rounded where the
        // sequence's own pass leaves it, whatever the packing).
        for (dtype, state_dtype, tol) in [(DType::F32, DType::F32, F32_TOL), (BF16, DType::F32, 1e-2), (BF16, BF16, 1e-2)] {
            let opts = LoadOptions {
                model: dir.to_string_lossy().into(),
                dtype,
                state_dtype,
                device: deltaserve_engine::parse_device("cuda").unwrap(),
                check_weights: false,
                prefill_algo: PrefillAlgo::Chunked,
                cuda_graphs: true,
                prefill_graph_tokens: 0,
                mixed_graph_tokens: 0,
                batch_invariant: false,
                tensor_parallel_size: 1,
                expert_split: Default::default(),
            };
            let engine = Engine::load(&opts).unwrap();
            let e = packed_model_prefill_error(engine.model(), 23);
            println!("{name} {dtype:?} (states {state_dtype:?}): packed model prefill vs alone, worst rel err {e:.2e}");
            assert!(e <= tol, "{name} {dtype:?} (states {state_dtype:?}): {e:.3e}");
        }
    }
}

/// A sequence prefilled beside running sequences' decode rows, then decoded beside new prompt
/// pieces, in mixed passes (`Engine::prefill_and_decode`, as the server runs them), against the
/// same sequence alone, on every compact fixture: within the f32 model tolerance in f32, and
/// within the packed prefill's bf16 tolerance (the projections' rounding follows the row count).
/// The bit-exact case, `--batch-invariant`, is in the batch-invariance test.
fn gpu_mixed_passes_equal_separate_passes(dev: &Device) {
    for (i, name) in deltaserve_tests::COMPACT_MODELS.iter().enumerate() {
        // bf16 with the bf16 mixer too (a bf16 model's default): its prompt rows leave the mixer
        // in bf16 beside the decode rows' f32.
        for (dtype, algo, tol) in
            [(DType::F32, PrefillAlgo::Chunked, F32_TOL), (BF16, PrefillAlgo::Chunked, 1e-2), (BF16, PrefillAlgo::ChunkedBf16, 1e-2)]
        {
            let m = deltaserve_tests::compact_model(name, dtype, dev);
            let e = deltaserve_tests::invariance::mixed_error(&m, 60 + i as u64, algo);
            println!("  {name} {dtype:?} {algo:?}: mixed passes vs alone, worst rel err {e:.2e}");
            assert!(e <= tol, "{name} {dtype:?} {algo:?}: {e:.3e} > {tol:e}");
        }
    }
}

/// A prefill that returns the last row's logits runs its last block's output head and channel
/// mixer for that row alone (one row through the small-batch kernels where the whole pass runs
/// cuBLAS): its logits equal the whole pass's last row within the packed prefill's bounds, and
/// the caches every row updates are the same bits (the next decode step's logits equal).
fn gpu_last_row_logits_equal_the_whole_pass_last_row(dev: &Device) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(8);
    for name in deltaserve_tests::COMPACT_MODELS {
        for (dtype, algo, tol) in
            [(DType::F32, PrefillAlgo::Chunked, F32_TOL), (BF16, PrefillAlgo::Chunked, 1e-2), (BF16, PrefillAlgo::ChunkedBf16, 1e-2)]
        {
            let m = deltaserve_tests::compact_model(name, dtype, dev);
            let v = m.config().common.vocab_size;
            let toks: Vec<u32> = (0..150).map(|_| rng.random_range(0..v as u32)).collect();
            let (e, same_caches) = deltaserve_tests::last_row_vs_whole_pass(&m, &toks, algo);
            println!("  {name} {dtype:?} {algo:?}: last row alone vs the whole pass's {e:.2e}");
            assert!(e <= tol, "{name} {dtype:?} {algo:?}: {e:.3e} > {tol:e}");
            assert!(same_caches, "{name} {dtype:?} {algo:?}: the caches after the two passes differ");
        }
    }
}

/// `prune --device cuda`: the grad method's gradient sums computed on the GPU equal the CPU's,
/// and every data-driven method prunes on the GPU into a checkpoint that loads, keeping (nearly)
/// the channels the CPU keeps.
fn gpu_pruning_calibration_matches_the_cpu(dev: &Device) {
    use deltaserve_pruning::{calibrate::taylor_sums, Method};
    let root = deltaserve_tests::tests_dir().join("..");
    let text: String = ["README.md", "engine/src/config/mod.rs", "kernels/src/cpu/gated_delta.rs"]
        .iter()
        .map(|f| std::fs::read_to_string(root.join(f)).unwrap())
        .collect();
    let calib = std::env::temp_dir().join(format!("deltaserve-gpu-calib-{}.txt", std::process::id()));
    std::fs::write(&calib, text).unwrap();
    for name in ["gdn", "gdp"] {
        let dir = compact_dir().join(name);
        let cfg = deltaserve_engine::read_config(&dir).unwrap();
        let ckpt = deltaserve_engine::weights::Checkpoint::open(&dir).unwrap();
        let (cpu, gpu) = (
            deltaserve_engine::CausalLm::load(&cfg, &ckpt, DType::F32, &Device::Cpu, false).unwrap(),
            deltaserve_engine::CausalLm::load(&cfg, &ckpt, DType::F32, dev, false).unwrap(),
        );
        let windows: Vec<Vec<u32>> = (0..2).map(|w| (0..150).map(|i| ((i * 37 + w * 11) % 500) as u32 + 3).collect()).collect();
        let (a, b) = (taylor_sums(&cpu, &windows, || {}).unwrap(), taylor_sums(&gpu, &windows, || {}).unwrap());
        let mut worst = 0f64;
        for (la, lb) in a.layers.iter().zip(&b.layers) {
            for (ta, tb) in la.iter().zip(lb) {
                worst = worst.max(rel_err(&values(tb), &values(ta)));
            }
        }
        println!("compact/{name}: grad sums GPU vs CPU rel err {worst:.2e}");
        assert!(worst <= F32_TOL, "compact/{name}: {worst:.3e}");
        for method in [Method::Swanda, Method::Grad, Method::Drrqr] {
            let run = |device: Device| {
                let (r, out) = prune_half(method, &dir, &calib, 7, device);
                (r.unwrap_or_else(|e| panic!("compact/{name} {method:?}: {e}")), out)
            };
            let ((rg, out), (rc, _)) = (run(dev.clone()), run(Device::Cpu));
            let (mut same, mut total) = (0usize, 0usize);
            for (hg, hc) in rg.kept.iter().flatten().zip(rc.kept.iter().flatten()) {
                same += hg.iter().filter(|i| hc.contains(i)).count();
                total += hc.len();
            }
            let agree = same as f64 / total as f64;
            println!("compact/{name} {method:?} on the GPU: kept channels agree with the CPU's {:.1}%", 100.0 * agree);
            assert!(agree >= 0.9, "compact/{name} {method:?}: {agree}");
            assert!(deltaserve_engine::Engine::load(&LoadOptions::cpu(out.path().to_string_lossy())).is_ok());
        }
    }
}

/// Decode steps replayed from CUDA graphs equal eager decode steps: the same logits and the same
/// states, while the batch size changes (first eager, then captured, then replayed) and the
/// slots of one size change between replays (order, membership, more than the 64 slots a
/// kernel takes by value).
fn gpu_decode_graphs_equal_eager_decode(dev: &Device) {
    for (name, dir, _, _) in model_fixtures("gpu_decode_graphs_equal_eager_decode") {
        for (dtype, state_dtype) in [(DType::F32, DType::F32), (BF16, DType::F32), (BF16, BF16)] {
            // The engine replays graphs (its default on a GPU); the model alone runs eagerly.
            let opts =
                LoadOptions { dtype, state_dtype, device: dev.clone(), cuda_graphs: true, ..LoadOptions::cpu(dir.to_str().unwrap()) };
            let engine = Engine::load(&opts).unwrap();
            let model = engine.model();
            let pools = 72;
            let mut graphs = model.new_pool(pools).unwrap();
            let mut eager = graphs.clone();
            let mut rng = rand::rngs::StdRng::seed_from_u64(11);
            let vocab = model.config().common.vocab_size as u32;
            let slots: Vec<_> = (0..pools).map(|_| graphs.allocate().unwrap()).collect();
            for &s in &slots {
                assert_eq!(eager.allocate(), Some(s));
                let prompt: Vec<u32> = (0..rng.random_range(1..40)).map(|_| rng.random_range(0..vocab)).collect();
                model.prefill(&mut graphs, s, &prompt, Logits::Last, PrefillAlgo::Chunked).unwrap();
                model.prefill(&mut eager, s, &prompt, Logits::Last, PrefillAlgo::Chunked).unwrap();
            }
            // Sizes 3, 1, 3, 3, 70, 3, 70, 70, 1, 1: each size eager, captured, then replayed
            // with other slots in another order. The steps marked lend the graph's logits buffer
            // (`decode_in_place`: captures at 2 and 8, replays at 3 and 7); the others return a
            // copy, which later steps of its size must leave as it was.
            let lend = [false, false, true, true, false, false, false, true, true, false];
            let mut copies = Vec::new();
            let mut worst: f64 = 0.0;
            for (step, &b) in [3usize, 1, 3, 3, 70, 3, 70, 70, 1, 1].iter().enumerate() {
                let mut order = slots.clone();
                for i in (1..order.len()).rev() {
                    order.swap(i, rng.random_range(0..=i));
                }
                let batch: Vec<_> = order[..b].iter().map(|&s| (s, rng.random_range(0..vocab))).collect();
                let got = if lend[step] { engine.decode_in_place(&mut graphs, &batch) } else { engine.decode(&mut graphs, &batch) };
                let got = got.unwrap();
                let lg = values(&got);
                let le = values(&model.decode(&mut eager, &batch).unwrap());
                let e = rel_err(&lg, &le);
                worst = worst.max(e);
                assert!(
                    e <= 1e-6,
                    "{name} {dtype:?} (states {state_dtype:?}) step {step} (B={b}, lent {}): logits rel err {e:.3e}",
                    lend[step]
                );
                if !lend[step] {
                    copies.push((step, got, lg));
                }
            }
            for (step, t, v) in copies {
                assert!(
                    values(&t) == v,
                    "{name} {dtype:?} (states {state_dtype:?}): step {step}'s copied logits changed under later steps"
                );
            }
            for l in 0..model.config().common.num_hidden_layers {
                for &s in &slots {
                    let (Some(g), Some(e)) = (graphs.layer(l).recurrent(), eager.layer(l).recurrent()) else { continue };
                    let de =
                        rel_err(&g.recurrent_state.slot_to_vec(s.index()).unwrap(), &e.recurrent_state.slot_to_vec(s.index()).unwrap());
                    let dc = rel_err(&g.conv_state.slot_to_vec(s.index()).unwrap(), &e.conv_state.slot_to_vec(s.index()).unwrap());
                    worst = worst.max(de).max(dc);
                    assert!(
                        de <= 1e-6 && dc <= 1e-6,
                        "{name} {dtype:?} (states {state_dtype:?}) layer {l} slot {s}: states {de:.3e} / {dc:.3e}"
                    );
                }
            }
            let captured = engine.cuda_graph_batches();
            println!("{name} {dtype:?} (states {state_dtype:?}): graph vs eager decode, worst rel err {worst:.2e}; captured batch sizes {captured:?}");
            let mut sorted = captured.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, vec![1, 3, 70], "{name} {dtype:?} (states {state_dtype:?}): every size seen twice is captured");
            // The graphs replayed above are the rebuilt ones: our kernels' launches overlap the
            // kernel before them.
            let overlap = engine.cuda_graph_overlap();
            for g in &overlap {
                println!("  B={}: {} kernels, {} programmatic edges, note {:?}", g.batch, g.kernels, g.programmatic, g.note);
                assert!(g.kernels > 0 && g.programmatic > 0 && g.note.is_none(), "{name} {dtype:?} (states {state_dtype:?}): {g:?}");
            }
        }
    }
}

/// `--batch-invariant`: every compact model in bf16, a sequence alone against batches of 2, 7
/// and 32 (packed prefill, decode steps, other slots and rows) and against its prompt cut at
/// chunk boundaries: bit for bit with the mode on. The default mode's differences are printed.
fn gpu_batch_invariant_mode_logits_do_not_depend_on_the_batch(dev: &Device) {
    use deltaserve_kernels::ops::{linear, set_batch_invariant};
    let _off = BatchInvariantOff;
    for (i, name) in deltaserve_tests::COMPACT_MODELS.iter().enumerate() {
        let m = deltaserve_tests::compact_model(name, DType::BF16, dev);
        set_batch_invariant(false);
        let default = deltaserve_tests::invariance::batch_differences(&m, 40 + i as u64);
        set_batch_invariant(true);
        let invariant = deltaserve_tests::invariance::batch_differences(&m, 40 + i as u64);
        for (case, differ) in &invariant {
            assert_eq!(*differ, 0, "{name} bf16, batch-invariant: {case}: {differ} logits differ from the sequence alone");
        }
        let moved: Vec<String> = default.iter().filter(|(_, d)| *d > 0).map(|(c, d)| format!("{c}: {d}")).collect();
        println!(
            "  {name} bf16: {} cases bit-identical with the mode on; default mode differs in {} ({})",
            invariant.len(),
            moved.len(),
            moved.join("; ")
        );
    }
    // The mode takes bf16/f16 projections only, and says so.
    let x = Tensor::ones((3, 64), DType::F32, dev).unwrap();
    let e = linear(&x, &Tensor::ones((5, 64), DType::F32, dev).unwrap()).unwrap_err().to_string();
    assert!(e.contains("bf16 or f16"), "{e}");
}

/// Snapshots written inside a GPU prefill pass (the f32 and the bf16 state kernels, the conv
/// states, shared KV blocks) continue a prompt as a whole prefill does. f32: within the f32
/// model tolerance, with the same greedy token wherever the margin is ≥ 1e-3. bf16: within
/// bf16's tolerance by default, where a pass's row count changes the projections' rounding (the
/// cached pass has fewer rows), and bit for bit with `--batch-invariant`.
fn gpu_prefix_cache_snapshots_match_whole_prefills(dev: &Device) {
    use deltaserve_kernels::ops::set_batch_invariant;
    struct Off;
    impl Drop for Off {
        fn drop(&mut self) {
            set_batch_invariant(false);
        }
    }
    let _off = Off;
    for (i, name) in deltaserve_tests::COMPACT_MODELS.iter().enumerate() {
        // The last case keeps the states in bf16 (`--state-dtype bf16`): snapshots written inside
        // the state pass and restored from their slots. Not bit for bit even in the
        // batch-invariant mode: the snapshot's state is rounded to bf16 where a whole prompt's
        // pass keeps it in f32 between chunks.
        for (dtype, algo, tol, invariant, state_dtype) in [
            (DType::F32, PrefillAlgo::Chunked, F32_TOL, false, DType::F32),
            (BF16, PrefillAlgo::ChunkedBf16, BF16_TOL, false, DType::F32),
            (BF16, PrefillAlgo::ChunkedBf16, 0.0, true, DType::F32),
            (BF16, PrefillAlgo::ChunkedBf16, BF16_TOL, false, BF16),
        ] {
            set_batch_invariant(invariant);
            let mut m = deltaserve_tests::compact_model(name, dtype, dev);
            m.set_state_dtype(state_dtype).unwrap();
            let cases = deltaserve_tests::prefix::cached_against_whole(&m, 40 + i as u64, algo, false);
            assert_eq!(cases.len(), 8, "{name}: every prompt finds a snapshot");
            let (mut worst, mut greedy) = (0f64, 0);
            for (case, cached, whole) in &cases {
                for (step, (a, b)) in cached.iter().zip(whole).enumerate() {
                    let e = rel_err(a, b);
                    worst = worst.max(e);
                    assert!(e <= tol, "{name} {dtype:?} invariant={invariant} states {state_dtype:?}: {case}, step {step}: {e:.3e}");
                    let mut sorted = b.clone();
                    sorted.sort_by(|x, y| y.total_cmp(x));
                    if dtype == DType::F32 && (sorted[0] - sorted[1]) as f64 >= GREEDY_MARGIN {
                        greedy += 1;
                        let top = |v: &[f32]| deltaserve_engine::sampling::argmax(v);
                        assert_eq!(top(a), top(b), "{name} {dtype:?}: {case}, step {step}: greedy token");
                    }
                }
            }
            println!(
                "  {name} {dtype:?} batch-invariant={invariant} states {state_dtype:?}: {} cases, worst {worst:.2e}, {greedy} greedy tokens compared",
                cases.len()
            );
        }
    }
}

//! A prefill's short conv and q/k preparation in one launch (`conv_prep.cu`) against the conv's
//! launch followed by the prep's: q, k, v, β, the gate and every slot's conv state (captures
//! included) bit for bit, at both head dims it compiles, with GVA, SiLU and none, bf16 and f32
//! outputs, bf16 and f16 inputs; the inputs it declines left untouched; and two models' logits
//! the same with it on and off.

use candle_core::{DType, Device, Tensor};
use deltaserve_kernels::cuda::{conv_prep_launches, set_conv_prep};
use deltaserve_kernels::ops::{conv_prefill_packed, conv_prepare_packed, prepare, PrepareInputs, QkLayout};
use deltaserve_kernels::{Capture, ConvActivation};
use deltaserve_tests::{every_slot, slots_holding, values};
use rand::{Rng, SeedableRng};

/// One case's outputs: q, k, v, β, the gate, then every slot's state.
type Outputs = (Vec<Vec<f32>>, Vec<Vec<f32>>);

pub fn gpu_conv_prep_equals_conv_then_prep(dev: &Device) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(61);
    let mut uniform = |rows: usize, cols: usize, r: f32| {
        let v: Vec<f32> = (0..rows * cols).map(|_| rng.random_range(-r..r)).collect();
        Tensor::from_vec(v, (rows, cols), &Device::Cpu).unwrap()
    };
    // Sequences shorter than the conv's width, empty, starting inside a tile and spanning many:
    // tiles whose taps all lie in one sequence and tiles that read slots' states.
    let lens = [33usize, 0, 1, 3, 70, 4, 31, 9, 2, 300];
    let mut cu = vec![0usize];
    for l in lens {
        cu.push(cu[cu.len() - 1] + l);
    }
    let rows = cu[lens.len()];
    let pool = 14;
    let slots: Vec<usize> = (0..lens.len()).map(|i| (i * 5 + 2) % 11).collect();
    // Prefix-cache captures (whole chunks) inside the long sequence and inside another, into
    // slots no sequence owns.
    let captures = [Capture { seq: 9, tokens: 128, slot: 12 }, Capture { seq: 4, tokens: 64, slot: 13 }];
    // (q/k heads, K, v heads, v dim): GVA at K = 128 (Qwen3.5's heads), K = 256 with 512-wide
    // value heads (fla's 1.3B layout).
    for (h, k, hv, vd) in [(4usize, 128usize, 8usize, 128usize), (2, 256, 2, 512)] {
        let (c, vw) = (2 * h * k + hv * vd, hv * vd);
        let layout = QkLayout { q_heads: h, k_heads: h, head_dim: k };
        // The fused projection's rows: [q | k | v | b | a | padding], as the model reads them,
        // a multiple of 8 columns (16-byte rows in bf16: the kernel copies whole 16 bytes).
        let proj = uniform(rows, (c + 2 * hv + 8).next_multiple_of(8), 2.0);
        let weight = uniform(c, 4, 0.7);
        let init: Vec<Vec<f32>> = (0..pool).map(|_| values(&uniform(c, 4, 1.0))).collect();
        let (a_log, dt_bias) = (uniform(1, hv, 1.0).flatten_all().unwrap(), uniform(1, hv, 1.0).flatten_all().unwrap());
        let cases = [
            (DType::BF16, DType::BF16, ConvActivation::Silu, true, false),
            (DType::BF16, DType::F32, ConvActivation::Silu, true, true),
            (DType::F16, DType::F32, ConvActivation::Silu, false, false),
            (DType::BF16, DType::BF16, ConvActivation::Identity, false, true),
        ];
        for (dtype, out, act, gated, neg) in cases {
            let on = |t: &Tensor| t.to_dtype(dtype).unwrap().to_device(dev).unwrap();
            let (p, wt) = (on(&proj), weight.to_device(dev).unwrap());
            let (al, db) = (a_log.to_device(dev).unwrap(), dt_bias.to_device(dev).unwrap());
            let (x, b, a) = (p.narrow(1, 0, c).unwrap(), p.narrow(1, c, hv).unwrap(), p.narrow(1, c + hv, hv).unwrap());
            let gate_in = gated.then_some((&a, &al, &db));
            let inputs = || PrepareInputs { layout, v_width: vw, b: &b, allow_neg_eigval: neg, gate_in };
            let what = format!("K={k} HV={hv} {dtype:?} -> {out:?} {act:?} gate {gated} neg {neg}");
            let collect = |p: deltaserve_kernels::ops::Prepared, v: Tensor, states: &deltaserve_kernels::SlotBuffer| -> Outputs {
                let mut t = vec![values(&p.q), values(&p.k), values(&v), values(&p.beta)];
                t.extend(p.g.as_ref().map(values));
                (t, every_slot(states, pool))
            };
            let fused = {
                let mut states = slots_holding(&init, c * 4, dev);
                let (p, v) = conv_prepare_packed(&x, &wt, &mut states, &cu, &slots, act, &captures, out, None, inputs())
                    .unwrap()
                    .unwrap_or_else(|| panic!("{what}: the fused pass declined"));
                assert_eq!((p.q.dtype(), p.q.dims(), v.dims()), (out, &[rows, h, k][..], &[rows, vw][..]), "{what}: outputs' shapes");
                collect(p, v, &states)
            };
            let apart = {
                let mut states = slots_holding(&init, c * 4, dev);
                let y = conv_prefill_packed(&x, &wt, &mut states, &cu, &slots, act, &captures, out, None).unwrap();
                let p = prepare(&y, layout, &b, neg, gate_in).unwrap();
                collect(p, y.narrow(1, 2 * h * k, vw).unwrap(), &states)
            };
            let names = ["q", "k", "v", "beta", "g"];
            for (i, (f, a)) in fused.0.iter().zip(&apart.0).enumerate() {
                assert_eq!(f, a, "{what}: {} of the fused pass != conv then prep", names[i]);
            }
            assert_eq!(fused.0.len(), apart.0.len(), "{what}: the gate's presence");
            assert_eq!(fused.1, apart.1, "{what}: slots' conv states (and the captures') after the pass");
            assert_ne!(fused.1, init, "{what}: the pass wrote no state");
            println!("GPU conv + prep in one launch, {what}: {rows} rows, q, k, v, beta, g and states bit for bit");
        }
        // Declined, nothing touched: a conv width of 3, f32 inputs, the switch off, the CPU.
        let x16 = proj.to_dtype(DType::BF16).unwrap().to_device(dev).unwrap();
        let (x, b) = (x16.narrow(1, 0, c).unwrap(), x16.narrow(1, c, hv).unwrap());
        let inputs = || PrepareInputs { layout, v_width: vw, b: &b, allow_neg_eigval: false, gate_in: None };
        let declined = |x: &Tensor, wt: &Tensor, dev: &Device, what: &str| {
            let w = wt.dim(1).unwrap();
            let init: Vec<Vec<f32>> = (0..pool).map(|i| vec![i as f32; c * w]).collect();
            let mut states = slots_holding(&init, c * w, dev);
            let got = conv_prepare_packed(x, wt, &mut states, &cu, &slots, ConvActivation::Silu, &[], DType::BF16, None, inputs()).unwrap();
            assert!(got.is_none(), "K={k}: the fused pass took {what}");
            assert_eq!(every_slot(&states, pool), init, "K={k}: {what} declined yet states changed");
        };
        declined(&x, &uniform(c, 3, 0.7).to_device(dev).unwrap(), dev, "a conv width of 3");
        declined(&x.to_dtype(DType::F32).unwrap(), &weight.to_device(dev).unwrap(), dev, "f32 inputs");
        let odd = Tensor::cat(&[&x16.narrow(1, 0, 1).unwrap(), &x16], 1).unwrap();
        declined(&odd.narrow(1, 1, c).unwrap(), &weight.to_device(dev).unwrap(), dev, "rows not 16-byte aligned");
        set_conv_prep(false);
        declined(&x, &weight.to_device(dev).unwrap(), dev, "inputs with the switch off");
        set_conv_prep(true);
        let (xc, bc) = (x.to_device(&Device::Cpu).unwrap(), b.to_device(&Device::Cpu).unwrap());
        let mut states = slots_holding(&init, c * 4, &Device::Cpu);
        let cpu_inputs = PrepareInputs { layout, v_width: vw, b: &bc, allow_neg_eigval: false, gate_in: None };
        let got =
            conv_prepare_packed(&xc, &weight, &mut states, &cu, &slots, ConvActivation::Silu, &[], DType::BF16, None, cpu_inputs).unwrap();
        assert!(got.is_none() && every_slot(&states, pool) == init, "K={k}: the CPU took the GPU's fused pass");
    }
    models_equal_with_and_without(dev);
}

/// Two random bf16 Gated DeltaNet models (fla's 1.3B heads, and Qwen3.5's GVA at K = 128): the
/// prompts' logits and the decode steps after them are the same bits with the fused pass on and
/// off, with the bf16 mixer and the near-fp32 one.
fn models_equal_with_and_without(dev: &Device) {
    use deltaserve_engine::{CausalLm, Logits, PrefillAlgo};
    let heads = [
        serde_json::json!({"num_heads": 6, "head_dim": 256, "expand_v": 2}),
        serde_json::json!({"num_heads": 4, "head_dim": 128, "num_v_heads": 8, "expand_v": 1}),
    ];
    for h in heads {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = serde_json::json!({
            "model_type": "gated_deltanet", "architectures": ["GatedDeltaNetForCausalLM"], "hidden_size": 1024,
            "num_hidden_layers": 2, "vocab_size": 512, "hidden_ratio": 4, "conv_size": 4, "use_gate": true,
            "use_short_conv": true, "norm_eps": 1e-6, "fuse_norm": true, "tie_word_embeddings": false
        });
        cfg.as_object_mut().unwrap().extend(h.as_object().unwrap().clone());
        deltaserve_engine::synth::write_random_checkpoint(&cfg, dir.path(), DType::BF16, 3, None).unwrap();
        let c = deltaserve_engine::read_config(dir.path()).unwrap();
        let ckpt = deltaserve_engine::weights::Checkpoint::open(dir.path()).unwrap();
        let model = CausalLm::load(&c, &ckpt, DType::BF16, dev, false).unwrap();
        for algo in [PrefillAlgo::ChunkedBf16, PrefillAlgo::Chunked] {
            let run = |fused: bool| -> Vec<f32> {
                set_conv_prep(fused);
                let mut rng = rand::rngs::StdRng::seed_from_u64(9);
                let mut pool = model.new_pool(4).unwrap();
                let slots: Vec<_> = (0..4).map(|_| pool.allocate().unwrap()).collect();
                let mut out = Vec::new();
                for (i, &s) in slots.iter().enumerate() {
                    let prompt: Vec<u32> = (0..[3, 70, 200, 9][i]).map(|_| rng.random_range(0..512)).collect();
                    out.extend(values(&model.prefill(&mut pool, s, &prompt, Logits::All, algo).unwrap()));
                }
                for _ in 0..3 {
                    let batch: Vec<_> = slots.iter().map(|&s| (s, rng.random_range(0..512u32))).collect();
                    out.extend(values(&model.decode(&mut pool, &batch).unwrap()));
                }
                set_conv_prep(true);
                out
            };
            let before = conv_prep_launches();
            let on = run(true);
            let ran = conv_prep_launches() - before;
            let off = run(false);
            assert_eq!(conv_prep_launches() - before, ran, "{h}: the fused pass ran while off");
            // One launch a layer for each of the four prompts.
            assert_eq!(ran, 2 * 4, "{h}: {algo:?}: fused launches");
            assert!(on.iter().all(|v| v.is_finite()), "{h}: {algo:?} logits not finite");
            assert_eq!(on, off, "{h}: {algo:?}: logits with the fused conv + prep != without");
            println!("GPU conv + prep in one launch, model {h} {algo:?}: {} logits bit for bit", on.len());
        }
    }
}

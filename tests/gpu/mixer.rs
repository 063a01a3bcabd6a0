//! The gated delta rule's kernels on the GPU against themselves and the CPU: packed prefill
//! against each sequence alone, the decode step in any slot order and from the raw projection
//! against prepare + step, and prefill across chunk boundaries.

use candle_core::{DType, Device, Tensor};
use deltaserve_kernels::ops::{
    gated_delta_prefill, gated_delta_prefill_packed, gated_delta_step, set_warpgroup_state_pass, MixerInputs, PrefillAlgo,
};
use deltaserve_kernels::{Capture, SlotBuffer};
use deltaserve_tests::{rel_err, values};
use rand::{Rng, SeedableRng};

use super::{BF16, BF16_TOL, F32_TOL};

/// Random mixer inputs of `t` tokens: q, k L2-normalised, β in (0, 1), g ≤ 0.
struct Case {
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    g: Tensor,
    n: usize,
}

fn random_case(rng: &mut rand::rngs::StdRng, t: usize, n: usize, h: usize, hv: usize, kd: usize, vd: usize) -> Case {
    let mut vec = |len: usize, f: &mut dyn FnMut(&mut rand::rngs::StdRng) -> f32| (0..len).map(|_| f(rng)).collect::<Vec<f32>>();
    let normal = &mut |r: &mut rand::rngs::StdRng| r.random_range(-1.0f32..1.0);
    let l2 = |x: Vec<f32>, shape: (usize, usize, usize)| {
        let t = Tensor::from_vec(x, shape, &Device::Cpu).unwrap();
        t.broadcast_div(&(t.sqr().unwrap().sum_keepdim(2).unwrap() + 1e-6).unwrap().sqrt().unwrap()).unwrap()
    };
    let q = l2(vec(t * h * kd, normal), (t, h, kd));
    let k = l2(vec(t * n * h * kd, normal), (t * n, h, kd));
    let v = Tensor::from_vec(vec(t * n * hv * vd, normal), (t * n, hv, vd), &Device::Cpu).unwrap();
    let beta = Tensor::from_vec(vec(t * n * hv, &mut |r| r.random_range(0.05f32..1.0)), (t * n, hv), &Device::Cpu).unwrap();
    let g = Tensor::from_vec(vec(t * hv, &mut |r| r.random_range(-0.3f32..0.0)), (t, hv), &Device::Cpu).unwrap();
    Case { q, k, v, beta, g, n }
}

impl Case {
    fn on(&self, dev: &Device) -> Case {
        let m = |t: &Tensor| t.to_device(dev).unwrap();
        Case { q: m(&self.q), k: m(&self.k), v: m(&self.v), beta: m(&self.beta), g: m(&self.g), n: self.n }
    }

    /// q, k and v in `dtype` (bf16 selects the tensor-core prefill); β and g stay f32.
    fn with_qkv(&self, dtype: DType) -> Case {
        let m = |t: &Tensor| t.to_dtype(dtype).unwrap();
        Case { q: m(&self.q), k: m(&self.k), v: m(&self.v), beta: self.beta.clone(), g: self.g.clone(), n: self.n }
    }

    fn inputs(&self) -> MixerInputs<'_> {
        let kd = self.q.dim(2).unwrap();
        MixerInputs { q: &self.q, k: &self.k, v: &self.v, beta: &self.beta, g: Some(&self.g), n: self.n, scale: (kd as f32).powf(-0.5) }
    }
}

/// The packed rows' boundaries: 0, then each sequence's end.
fn cu_seqlens(lens: &[usize]) -> Vec<usize> {
    std::iter::once(0)
        .chain(lens.iter().scan(0, |end, &l| {
            *end += l;
            Some(*end)
        }))
        .collect()
}

/// `n` random initial states of `per` values in [-0.5, 0.5).
fn random_states(rng: &mut rand::rngs::StdRng, n: usize, per: usize) -> Vec<Vec<f32>> {
    (0..n).map(|_| (0..per).map(|_| rng.random_range(-0.5f32..0.5)).collect()).collect()
}

fn cat(cases: &[&Case]) -> Case {
    let c = |f: &dyn Fn(&Case) -> &Tensor| Tensor::cat(&cases.iter().map(|x| f(x)).collect::<Vec<_>>(), 0).unwrap();
    Case { q: c(&|x| &x.q), k: c(&|x| &x.k), v: c(&|x| &x.v), beta: c(&|x| &x.beta), g: c(&|x| &x.g), n: cases[0].n }
}

/// Shapes: plain, GVA (HV = 2H) and a Gated DeltaProduct with n = 2; K and V include a pruned
/// head dim (48), the largest (256) and odd sizes (K = 40, V = 50: scalar loads and the
/// one-column-per-lane decode kernel); the last is the benchmarks' K = 128, V = 256 with GVA
/// and GDP.
const SHAPES: [(usize, usize, usize, usize, usize); 6] =
    [(1, 2, 2, 64, 64), (1, 2, 4, 48, 96), (2, 2, 2, 32, 64), (1, 1, 1, 256, 256), (1, 2, 2, 40, 50), (2, 2, 4, 128, 256)];

/// Shapes wide enough (5 sequences × 8 value heads × 4 tiles of 64 columns ≥ the H100's 132
/// SMs) that the packed bf16 state pass takes 64-column value tiles while each sequence alone
/// takes 32: packed == alone then also holds the two tilings, and at K ≤ 64 the double-buffered
/// loads, to each other (the alone runs are checked against the CPU elsewhere). At K = 256 the
/// split (f32) pass packed takes 32-column tiles (320 CTAs: three waves of 132 SMs) and alone 16.
const WIDE_SHAPES: [(usize, usize, usize, usize, usize); 3] = [(1, 4, 8, 64, 256), (1, 8, 8, 128, 256), (1, 4, 8, 256, 256)];

/// With the bf16 state pass on mma.sync and on the warpgroup tensor cores (where eligible).
pub(crate) fn gpu_packed_prefill_equals_prefilling_each_alone(dev: &Device) {
    for wg in [false, true] {
        set_warpgroup_state_pass(wg);
        packed_equals_alone(dev, wg);
    }
    set_warpgroup_state_pass(true);
}

fn packed_equals_alone(dev: &Device, wg: bool) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    let bf16_only = |((_, _, _, _, _), dtype): &((usize, usize, usize, usize, usize), DType)| !wg || *dtype == BF16;
    let cases = SHAPES.into_iter().chain(WIDE_SHAPES).flat_map(|s| [(s, DType::F32), (s, BF16)]).filter(bf16_only);
    for ((n, h, hv, kd, vd), dtype) in cases {
        let lens = [65usize, 1, 130, 64, 7];
        let slots = [3usize, 0, 4, 1, 2];
        let cases: Vec<Case> = lens.iter().map(|&t| random_case(&mut rng, t, n, h, hv, kd, vd).on(dev).with_qkv(dtype)).collect();
        let per = hv * kd * vd;
        let h0 = random_states(&mut rng, lens.len(), per);
        let mut packed_states = SlotBuffer::zeros_on(5, per, dev).unwrap();
        for (i, &s) in slots.iter().enumerate() {
            packed_states.write_slot(s, &h0[i]).unwrap();
        }
        let all = cat(&cases.iter().collect::<Vec<_>>());
        let cu = cu_seqlens(&lens);
        let o = gated_delta_prefill_packed(all.inputs(), &mut packed_states, &cu, &slots, PrefillAlgo::Chunked, &[], None).unwrap();
        let mut worst = 0f64;
        for (i, case) in cases.iter().enumerate() {
            let mut alone = SlotBuffer::zeros_on(1, per, dev).unwrap();
            alone.write_slot(0, &h0[i]).unwrap();
            let oi = gated_delta_prefill(case.inputs(), &mut alone, 0, PrefillAlgo::Chunked).unwrap();
            let e_o = rel_err(&values(&o.narrow(0, cu[i], lens[i]).unwrap()), &values(&oi));
            let e_s = rel_err(&packed_states.slot_to_vec(slots[i]).unwrap(), &alone.slot_to_vec(0).unwrap());
            worst = worst.max(e_o).max(e_s);
        }
        println!("packed vs alone ({dtype:?} q/k/v, n={n} H={h} HV={hv} K={kd} V={vd}, warpgroup pass {wg}): worst rel err {worst:.2e}");
        assert!(worst <= 1e-6, "packed prefill differs: {worst:.3e}");
    }
}

pub(crate) fn gpu_decode_in_any_slot_order_equals_each_alone(dev: &Device) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    // Batches of 6, 12 and 40: the kernel takes 1, 2 or 4 value columns a lane as the step's
    // CTAs fill fewer or more of the SMs, so each shape meets several of those kernels.
    for ((n, h, hv, kd, vd), b) in SHAPES.into_iter().flat_map(|s| [(s, 6), (s, 12), (s, 40)]) {
        let per = hv * kd * vd;
        let step = random_case(&mut rng, b, n, h, hv, kd, vd);
        let gpu_step = step.on(dev);
        let h0: Vec<Vec<f32>> = (0..b).map(|_| (0..per).map(|_| rng.random_range(-0.5f32..0.5)).collect()).collect();
        // Distinct slots out of order (5 is prime to the pool size), two of the pool untouched.
        let pool = b + 2;
        let slots: Vec<usize> = (0..b).map(|i| (i * 5 + 2) % pool).collect();
        let mut batch = SlotBuffer::zeros_on(pool, per, dev).unwrap();
        for (i, &s) in slots.iter().enumerate() {
            batch.write_slot(s, &h0[i]).unwrap();
        }
        let o = gated_delta_step(gpu_step.inputs(), &mut batch, &slots).unwrap();
        let mut worst = 0f64;
        for i in 0..b {
            let one = Case {
                q: step.q.narrow(0, i, 1).unwrap(),
                k: step.k.narrow(0, i * n, n).unwrap(),
                v: step.v.narrow(0, i * n, n).unwrap(),
                beta: step.beta.narrow(0, i * n, n).unwrap(),
                g: step.g.narrow(0, i, 1).unwrap(),
                n,
            };
            // Alone, on the CPU reference: the GPU batch must agree with it row by row.
            let mut cpu = SlotBuffer::zeros(1, per);
            cpu.write_slot(0, &h0[i]).unwrap();
            let oi = gated_delta_step(one.inputs(), &mut cpu, &[0]).unwrap();
            worst = worst.max(rel_err(&values(&o.narrow(0, i, 1).unwrap()), &values(&oi)));
            worst = worst.max(rel_err(&batch.slot_to_vec(slots[i]).unwrap(), &cpu.slot_to_vec(0).unwrap()));
        }
        println!("decode batch of {b} vs each alone on the CPU (n={n} H={h} HV={hv} K={kd} V={vd}): worst rel err {worst:.2e}");
        assert!(worst <= 1e-5, "batched decode differs: {worst:.3e}");
    }
}

/// The decode step on the conv output and projection as they are (q/k l2norm, β and the gate
/// formed inside the step's kernel) equals `prepare` then the step (`StepFusion::Apart`, the
/// prep kernel then the step's), bit for bit on the GPU and
/// to 1e-5 against the CPU: Gated DeltaNet with GVA and Gated DeltaProduct (n = 2, 3), K = 64,
/// 100 and 256, β and the gate's inputs as f32, bf16 and f16 column slices, with and without a
/// forget gate and negative eigenvalues, batches of 1, 6 and 40 (one, two and four value
/// columns a lane; at K = 256 and many heads, the half-size blocks), shuffled slots, v's rows
/// aligned for 16-byte accesses or not.
pub(crate) fn gpu_raw_decode_step_equals_prepare_then_step(dev: &Device) {
    use deltaserve_kernels::ops::{gated_delta_step_raw, QkLayout, RawStepInputs, StepFusion};
    let mut rng = rand::rngs::StdRng::seed_from_u64(17);
    // (n, H, HV, K, V, gate, allow_neg_eigval, dtype of b and a)
    let cases = [
        (1usize, 2usize, 4usize, 64usize, 128usize, true, false, BF16),
        (1, 1, 2, 256, 96, true, true, DType::F32),
        (2, 2, 2, 100, 64, true, true, DType::F16),
        (3, 2, 2, 64, 32, false, false, BF16),
        // Batch 40 of these fills two blocks an SM at two columns a lane: K > 128 then runs the
        // half-size blocks (decode.rs's WIDE_K_MANY), batch 6 the full ones.
        (1, 2, 8, 256, 128, true, false, BF16),
        (2, 1, 4, 256, 256, true, true, DType::F32),
    ];
    for ((n, h, hv, kd, vd, gated, neg, dtype), b) in cases.into_iter().flat_map(|c| [(c, 1usize), (c, 6), (c, 40)]) {
        let mut rand = |rows: usize, cols: usize, lo: f32, hi: f32| {
            let v: Vec<f32> = (0..rows * cols).map(|_| rng.random_range(lo..hi)).collect();
            Tensor::from_vec(v, (rows, cols), &Device::Cpu).unwrap()
        };
        // v's rows 16-byte aligned (the vector kernel), except for n = 3 (the scalar one).
        let v_offset = (h + n * h) * kd + if n == 3 { 3 } else { 4 };
        let conv = rand(b, v_offset + n * hv * vd + 4, -1.0, 1.0);
        // proj: 3 other columns, then b (n·HV), then a (HV).
        let proj = rand(b, 3 + n * hv + hv, -3.0, 3.0).to_dtype(dtype).unwrap();
        let (a_log, dt_bias) = (rand(1, hv, -1.0, 1.0).flatten_all().unwrap(), rand(1, hv, -1.0, 1.0).flatten_all().unwrap());
        let per = hv * kd * vd;
        let pool = b + 2;
        let slots: Vec<usize> = (0..b).map(|i| (i * 5 + 2) % pool).collect();
        let init: Vec<Vec<f32>> = (0..pool).map(|_| (0..per).map(|_| rng.random_range(-0.5f32..0.5)).collect()).collect();
        let layout = QkLayout { q_heads: h, k_heads: n * h, head_dim: kd };
        let scale = (kd as f32).powf(-0.5);
        let run = |device: &Device, fusion: StepFusion| {
            let on = |t: &Tensor| t.to_device(device).unwrap();
            let (c, p, al, db) = (on(&conv), on(&proj), on(&a_log), on(&dt_bias));
            let (bb, a) = (p.narrow(1, 3, n * hv).unwrap(), p.narrow(1, 3 + n * hv, hv).unwrap());
            let mut states = SlotBuffer::zeros_on(pool, per, device).unwrap();
            for (i, s) in init.iter().enumerate() {
                states.write_slot(i, s).unwrap();
            }
            let raw = RawStepInputs {
                conv_out: &c,
                layout,
                v_offset,
                v_heads: hv,
                v_dim: vd,
                b: &bb,
                allow_neg_eigval: neg,
                gate_in: gated.then_some((&a, &al, &db)),
                n,
                scale,
            };
            let o = gated_delta_step_raw(raw, &mut states, &slots, fusion).unwrap();
            (values(&o), (0..pool).map(|i| states.slot_to_vec(i).unwrap()).collect::<Vec<_>>())
        };
        let (raw, apart, cpu) = (run(dev, StepFusion::Fused), run(dev, StepFusion::Apart), run(&Device::Cpu, StepFusion::Auto));
        assert_eq!(raw.0, apart.0, "raw step o != prepare + step (n={n} H={h} HV={hv} K={kd} V={vd} B={b} {dtype:?})");
        assert_eq!(raw.1, apart.1, "raw step states != prepare + step (n={n} H={h} HV={hv} K={kd} V={vd} B={b})");
        let e = rel_err(&raw.0, &cpu.0).max(rel_err(&raw.1.concat(), &cpu.1.concat()));
        println!(
            "raw decode step n={n} H={h} HV={hv} K={kd} V={vd} B={b} {dtype:?} gate={gated} neg={neg}: == prepare + step; vs CPU {e:.2e}"
        );
        assert!(e <= 1e-5, "raw step vs CPU: {e:.3e}");
    }
}

/// In the batch-invariant mode a sequence's decode step gives the same bits in a batch of 40 as
/// alone (o's row and its state), raw and prepared inputs, K = 128 and 256 (where the step's
/// kernel shape would otherwise change with the batch's size).
pub(crate) fn gpu_batch_invariant_mode_decode_step_rows_do_not_depend_on_the_batch(dev: &Device) {
    use deltaserve_kernels::ops::{gated_delta_step_raw, set_batch_invariant, QkLayout, RawStepInputs, StepFusion};
    let mut rng = rand::rngs::StdRng::seed_from_u64(23);
    let (n, h, hv, vd, b) = (1usize, 2usize, 8usize, 128usize, 40usize);
    let _off = super::BatchInvariantOff;
    set_batch_invariant(true);
    for (kd, fusion) in [(128usize, StepFusion::Fused), (256, StepFusion::Fused), (256, StepFusion::Apart)] {
        let mut rand = |rows: usize, cols: usize, lo: f32, hi: f32| {
            let v: Vec<f32> = (0..rows * cols).map(|_| rng.random_range(lo..hi)).collect();
            Tensor::from_vec(v, (rows, cols), dev).unwrap()
        };
        let v_offset = (h + n * h) * kd;
        let conv = rand(b, v_offset + n * hv * vd, -1.0, 1.0);
        let proj = rand(b, n * hv + hv, -3.0, 3.0).to_dtype(BF16).unwrap();
        let (a_log, dt_bias) = (rand(1, hv, -1.0, 1.0).flatten_all().unwrap(), rand(1, hv, -1.0, 1.0).flatten_all().unwrap());
        let per = hv * kd * vd;
        let init: Vec<Vec<f32>> = (0..b).map(|_| (0..per).map(|_| rng.random_range(-0.5f32..0.5)).collect()).collect();
        // Rows `rows` of the batch in slots 0.. of a fresh pool: o and the states after the step.
        let step = |rows: std::ops::Range<usize>| {
            let len = rows.len();
            let (c, p) = (conv.narrow(0, rows.start, len).unwrap(), proj.narrow(0, rows.start, len).unwrap());
            let (bb, a) = (p.narrow(1, 0, n * hv).unwrap(), p.narrow(1, n * hv, hv).unwrap());
            let mut states = SlotBuffer::zeros_on(len, per, dev).unwrap();
            for (slot, row) in rows.clone().enumerate() {
                states.write_slot(slot, &init[row]).unwrap();
            }
            let raw = RawStepInputs {
                conv_out: &c,
                layout: QkLayout { q_heads: h, k_heads: n * h, head_dim: kd },
                v_offset,
                v_heads: hv,
                v_dim: vd,
                b: &bb,
                allow_neg_eigval: false,
                gate_in: Some((&a, &a_log, &dt_bias)),
                n,
                scale: (kd as f32).powf(-0.5),
            };
            let slots: Vec<usize> = (0..len).collect();
            let o = gated_delta_step_raw(raw, &mut states, &slots, fusion).unwrap();
            (values(&o), (0..len).map(|i| states.slot_to_vec(i).unwrap()).collect::<Vec<_>>())
        };
        let all = step(0..b);
        let row = hv * vd;
        for i in [0, 17, b - 1] {
            let alone = step(i..i + 1);
            assert_eq!(alone.0[..], all.0[i * row..(i + 1) * row], "o of row {i} alone != in the batch (K={kd} {fusion:?})");
            assert_eq!(alone.1[0], all.1[i], "state of row {i} alone != in the batch (K={kd} {fusion:?})");
        }
        println!("batch-invariant decode step K={kd} {fusion:?}: rows 0, 17, {} alone == in a batch of {b}", b - 1);
    }
}

pub(crate) fn gpu_chunk_boundaries_match_cpu(dev: &Device) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(9);
    // f32 covers each split state pass's key tiling (K = 64, 128, 256: keys in W's buffer) and
    // GVA with odd K and V (scalar tile copies).
    let shapes = [
        (1, 2, 2, 128, 128, DType::F32),
        (2, 1, 1, 64, 64, DType::F32),
        (1, 1, 2, 256, 64, DType::F32),
        (1, 2, 4, 40, 50, DType::F32),
        (1, 2, 2, 128, 128, BF16),
        (2, 1, 1, 64, 64, BF16),
        (1, 1, 2, 40, 48, BF16),
    ];
    for t in [1usize, 63, 64, 65, 4097] {
        for (n, h, hv, kd, vd, dtype) in shapes {
            // The CPU reference computes in f32 from the same (rounded) inputs.
            let case = random_case(&mut rng, t, n, h, hv, kd, vd).with_qkv(dtype);
            let per = hv * kd * vd;
            let h0: Vec<f32> = (0..per).map(|_| rng.random_range(-0.5f32..0.5)).collect();
            let mut cpu = SlotBuffer::zeros(1, per);
            cpu.write_slot(0, &h0).unwrap();
            let oc = gated_delta_prefill(case.inputs(), &mut cpu, 0, PrefillAlgo::Chunked).unwrap();
            let g = case.on(dev);
            let mut gs = SlotBuffer::zeros_on(1, per, dev).unwrap();
            gs.write_slot(0, &h0).unwrap();
            let og = gated_delta_prefill(g.inputs(), &mut gs, 0, PrefillAlgo::Chunked).unwrap();
            let (eo, es) = (rel_err(&values(&og), &values(&oc)), rel_err(&gs.slot_to_vec(0).unwrap(), &cpu.slot_to_vec(0).unwrap()));
            let tol = if dtype == BF16 { BF16_TOL } else { F32_TOL };
            println!("T={t} n={n} HV={hv} K={kd} V={vd} {dtype:?} q/k/v: GPU vs CPU o {eo:.2e}, state {es:.2e}");
            assert!(eo <= tol && es <= tol, "T={t} {dtype:?}: o {eo:.3e}, state {es:.3e}");
        }
    }
}

/// The bf16 prep taking two value heads of a key head at once (one K Kᵀ and Q Kᵀ for both)
/// against one value head a CTA: the same outputs and states bit for bit, at GVA ratios 2 and 4,
/// packed sequences of 1–4,097 tokens (chunks of every length, padding rows) and K = 40, 128, 256.
pub(crate) fn gpu_paired_prep_equals_one_head_a_cta(dev: &Device) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(21);
    for (n, h, hv, kd, vd) in [(1, 2, 4, 128, 128), (1, 1, 4, 40, 48), (2, 2, 4, 64, 64), (1, 1, 2, 256, 128)] {
        let lens = [4097usize, 1, 130, 64];
        let cases: Vec<Case> = lens.iter().map(|&t| random_case(&mut rng, t, n, h, hv, kd, vd).on(dev).with_qkv(BF16)).collect();
        let all = cat(&cases.iter().collect::<Vec<_>>());
        let cu = cu_seqlens(&lens);
        let per = hv * kd * vd;
        let h0 = random_states(&mut rng, lens.len(), per);
        let slots = [2usize, 0, 3, 1];
        let run = |pairs: bool| {
            // The warpgroup prep takes K ≤ 128 wherever it may: off, so that these two run.
            deltaserve_kernels::ops::set_warpgroup_prep(false);
            deltaserve_kernels::ops::set_paired_prep(pairs);
            let mut states = SlotBuffer::zeros_on(4, per, dev).unwrap();
            for (i, &s) in slots.iter().enumerate() {
                states.write_slot(s, &h0[i]).unwrap();
            }
            let o = gated_delta_prefill_packed(all.inputs(), &mut states, &cu, &slots, PrefillAlgo::Chunked, &[], None).unwrap();
            let s: Vec<Vec<f32>> = (0..4).map(|i| states.slot_to_vec(i).unwrap()).collect();
            (values(&o), s)
        };
        let (o1, s1) = run(false);
        let (o2, s2) = run(true);
        deltaserve_kernels::ops::set_paired_prep(true);
        deltaserve_kernels::ops::set_warpgroup_prep(true);
        let same = |a: &[f32], b: &[f32]| a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
        let states_same = s1.iter().zip(&s2).all(|(a, b)| same(a, b));
        println!("paired prep (n={n} H={h} HV={hv} K={kd} V={vd}): outputs equal {}, states equal {states_same}", same(&o1, &o2));
        assert!(same(&o1, &o2) && states_same, "paired prep differs at H={h} HV={hv} K={kd}");
        // Not a vacuous comparison: the outputs are not all zero.
        assert!(o1.iter().any(|x| x.abs() > 1e-3));
    }
}

/// The warpgroup (wgmma) prep of the bf16 chunked prefill against chunk_tc_prep, one value
/// head a CTA and (at even GVA ratios) two: the same outputs and states bit for bit (its Gram
/// products give wmma's sums, its decays and inversion are the same expressions), with the state
/// pass K takes after each (warpgroup up to 128, mma.sync above). Packed sequences of 1–4,097
/// tokens in permuted slots, GVA 1, 2, 3 and 4, K = 32, 64, 120 (zero-padded to 128), 128, 192
/// (zero-padded to 256) and 256, Gated DeltaProduct's n = 2.
pub(crate) fn gpu_warpgroup_prep_equals_tc_prep(dev: &Device) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(41);
    let shapes = [
        (1, 2, 4, 128, 128),
        (1, 2, 2, 64, 128),
        (1, 1, 3, 120, 72),
        (2, 1, 2, 128, 64),
        (1, 2, 8, 32, 64),
        (1, 1, 2, 256, 128),
        (1, 2, 2, 192, 64),
    ];
    for (n, h, hv, kd, vd) in shapes {
        let lens = [4097usize, 1, 130, 64];
        let slots = [2usize, 0, 3, 1];
        let cases: Vec<Case> = lens.iter().map(|&t| random_case(&mut rng, t, n, h, hv, kd, vd).on(dev).with_qkv(BF16)).collect();
        let all = cat(&cases.iter().collect::<Vec<_>>());
        let cu = cu_seqlens(&lens);
        let per = hv * kd * vd;
        let h0 = random_states(&mut rng, lens.len(), per);
        let run = |wg_prep: bool, pairs: bool| {
            deltaserve_kernels::ops::set_warpgroup_prep(wg_prep);
            deltaserve_kernels::ops::set_paired_prep(pairs);
            let mut states = SlotBuffer::zeros_on(4, per, dev).unwrap();
            for (i, &s) in slots.iter().enumerate() {
                states.write_slot(s, &h0[i]).unwrap();
            }
            let o = gated_delta_prefill_packed(all.inputs(), &mut states, &cu, &slots, PrefillAlgo::Chunked, &[], None).unwrap();
            let s: Vec<f32> = (0..4).flat_map(|i| states.slot_to_vec(i).unwrap()).collect();
            (values(&o), s)
        };
        let (ow, sw) = run(true, true);
        let (o1, s1) = run(false, false);
        let (o2, s2) = run(false, true);
        deltaserve_kernels::ops::set_warpgroup_prep(true);
        deltaserve_kernels::ops::set_paired_prep(true);
        let same = |a: &[f32], b: &[f32]| a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
        let (one, two) = (same(&ow, &o1) && same(&sw, &s1), same(&ow, &o2) && same(&sw, &s2));
        println!("warpgroup prep (n={n} H={h} HV={hv} K={kd} V={vd}): equals one head a CTA {one}, two heads a CTA {two}");
        assert!(one && two, "warpgroup prep differs at H={h} HV={hv} K={kd}");
        assert!(ow.iter().any(|x| x.abs() > 1e-3), "outputs all but zero");
    }
}

/// The warpgroup state pass on two warpgroups (a producer issuing the copies, a consumer running
/// the products) against the one-warpgroup pass: the same outputs, final states and captured
/// snapshots bit for bit (the same products and expressions in the same order). Packed sequences
/// of 1–4,097 tokens in permuted slots (the longest picks the two-warpgroup pass; partial
/// chunks, padding rows, an empty sequence), captures at chunk ends, GVA 1, 2 and 4, K = 64, 120
/// (zero-padded to 128) and 128, V of one to four 64-column tiles and a partial one (72), Gated
/// DeltaProduct's n = 2.
pub(crate) fn gpu_two_warpgroup_pass_equals_one(dev: &Device) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(43);
    for (n, h, hv, kd, vd) in [(1, 2, 4, 128, 128), (1, 2, 2, 64, 256), (1, 1, 1, 120, 72), (2, 2, 4, 128, 64), (1, 1, 2, 64, 64)] {
        let lens = [4097usize, 1, 0, 130, 320];
        let slots = [2usize, 0, 4, 3, 1];
        // Built on the host (the empty sequence's tensors have no elements to convert on a GPU).
        let cases: Vec<Case> = lens.iter().map(|&t| random_case(&mut rng, t, n, h, hv, kd, vd).with_qkv(BF16)).collect();
        let all = cat(&cases.iter().collect::<Vec<_>>()).on(dev);
        let cu = cu_seqlens(&lens);
        let per = hv * kd * vd;
        let h0 = random_states(&mut rng, lens.len(), per);
        let captures = [
            Capture { seq: 0, tokens: 64 * 3, slot: 5 },
            Capture { seq: 0, tokens: 64 * 40, slot: 6 },
            Capture { seq: 4, tokens: 64 * 2, slot: 7 },
        ];
        let run = |ws: bool| {
            deltaserve_kernels::ops::set_two_warpgroup_pass(ws);
            let mut states = SlotBuffer::zeros_on(8, per, dev).unwrap();
            for (i, &s) in slots.iter().enumerate() {
                states.write_slot(s, &h0[i]).unwrap();
            }
            let o = gated_delta_prefill_packed(all.inputs(), &mut states, &cu, &slots, PrefillAlgo::Chunked, &captures, None).unwrap();
            let s: Vec<f32> = (0..8).flat_map(|i| states.slot_to_vec(i).unwrap()).collect();
            (values(&o), s)
        };
        let launches = deltaserve_kernels::ops::two_warpgroup_launches;
        let before = launches();
        let (o2, s2) = run(true);
        let on = launches() - before;
        let (o1, s1) = run(false);
        let off = launches() - before - on;
        deltaserve_kernels::ops::set_two_warpgroup_pass(true);
        assert!(on == 1 && off == 0, "two-warpgroup passes launched: {on} on, {off} off (expected 1 and 0)");
        let same = |a: &[f32], b: &[f32]| a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
        let (outs, sts) = (same(&o2, &o1), same(&s2, &s1));
        println!("two-warpgroup pass (n={n} H={h} HV={hv} K={kd} V={vd}): outputs equal {outs}, states and snapshots equal {sts}");
        assert!(outs && sts, "two-warpgroup pass differs at H={h} HV={hv} K={kd} V={vd}");
        assert!(o2.iter().any(|x| x.abs() > 1e-3), "outputs all but zero");
        let snap = &s2[5 * per..8 * per];
        assert!(snap.iter().any(|x| x.abs() > 1e-3), "snapshots all but zero");
    }
}

/// The warpgroup (wgmma) state pass of the bf16 chunked prefill against the CPU's f32 prefill
/// and against the mma.sync pass, both forced: packed sequences of 0–4,097 tokens (partial
/// chunks, padding rows) in permuted slots, snapshots of the states at two chunk ends, GVA, K =
/// 64, 120 (zero-padded to 128) and 128, and past 128 the pass that splits Sᵀ's keys between two
/// warpgroups (K = 192 and 256), V of one to eight 64-column tiles and a partial one (72), Gated
/// DeltaProduct's n = 2.
pub(crate) fn gpu_warpgroup_state_pass_matches_cpu(dev: &Device) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(31);
    let shapes = [
        (1, 2, 4, 128, 128),
        (1, 2, 2, 64, 256),
        (1, 1, 1, 120, 72),
        (2, 2, 4, 128, 64),
        (1, 1, 2, 256, 128),
        (1, 1, 1, 192, 72),
        (2, 1, 1, 256, 64),
        (1, 1, 1, 256, 512),
    ];
    for (n, h, hv, kd, vd) in shapes {
        let lens = [4097usize, 1, 0, 130, 64];
        let slots = [2usize, 0, 6, 3, 1];
        let captures = [Capture { seq: 0, tokens: 64 * 3, slot: 4 }, Capture { seq: 3, tokens: 128, slot: 5 }];
        let cases: Vec<Case> = lens.iter().map(|&t| random_case(&mut rng, t, n, h, hv, kd, vd).with_qkv(BF16)).collect();
        let all = cat(&cases.iter().collect::<Vec<_>>());
        let cu = cu_seqlens(&lens);
        let per = hv * kd * vd;
        let h0 = random_states(&mut rng, lens.len(), per);
        let fill = |states: &mut SlotBuffer| {
            for (i, &s) in slots.iter().enumerate() {
                states.write_slot(s, &h0[i]).unwrap();
            }
        };
        let mut cpu = SlotBuffer::zeros(7, per);
        fill(&mut cpu);
        let oc = gated_delta_prefill_packed(all.inputs(), &mut cpu, &cu, &slots, PrefillAlgo::Chunked, &captures, None).unwrap();
        let sc: Vec<f32> = (0..7).flat_map(|i| cpu.slot_to_vec(i).unwrap()).collect();
        let g = all.on(dev);
        let run = |wg: bool| {
            set_warpgroup_state_pass(wg);
            let mut states = SlotBuffer::zeros_on(7, per, dev).unwrap();
            fill(&mut states);
            let o = gated_delta_prefill_packed(g.inputs(), &mut states, &cu, &slots, PrefillAlgo::Chunked, &captures, None).unwrap();
            let s: Vec<f32> = (0..7).flat_map(|i| states.slot_to_vec(i).unwrap()).collect();
            (values(&o), s)
        };
        let split = deltaserve_kernels::ops::split_key_pass_launches;
        let before = split();
        let (om, sm) = run(false);
        let off = split() - before;
        let (ow, sw) = run(true);
        let on = split() - before - off;
        set_warpgroup_state_pass(true);
        let expected = usize::from(kd > 128);
        assert!(on == expected && off == 0, "split-key passes launched: {on} on, {off} off (expected {expected} and 0) at K={kd}");
        assert!(sw[4 * per..6 * per].iter().any(|x| x.abs() > 1e-3), "snapshots all but zero (K={kd})");
        let oc = values(&oc);
        let (em, ew) = (rel_err(&om, &oc).max(rel_err(&sm, &sc)), rel_err(&ow, &oc).max(rel_err(&sw, &sc)));
        let between = rel_err(&ow, &om).max(rel_err(&sw, &sm));
        println!(
            "warpgroup pass n={n} H={h} HV={hv} K={kd} V={vd}: against the CPU {ew:.2e} (mma.sync {em:.2e}), between them {between:.2e}"
        );
        assert!(ew <= BF16_TOL, "warpgroup pass against the CPU: {ew:.3e} (K={kd} V={vd})");
        // The two passes round differently (the decay on V' or on the keys): not bit for bit, but
        // within the bf16 tolerance of each other, and not the same result by accident.
        assert!(between <= BF16_TOL && between > 0.0, "warpgroup against mma.sync: {between:.3e}");
    }
}

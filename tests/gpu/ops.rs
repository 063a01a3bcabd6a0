//! Single ops on the GPU against the CPU's: paged attention, the short conv and SwiGLU, the
//! mixer's preparation and gated norm, the small-batch projection kernels and the sparse MoE.

use candle_core::{DType, Device, Tensor};
use deltaserve_kernels::SlotBuffer;
use deltaserve_tests::{rel_err, values};
use rand::{Rng, SeedableRng};

use super::BF16;

/// Paged attention on the GPU equals the CPU's op (f32 cache): with an f32 cache, the fp32 row
/// kernel to 1e-5; with a bf16/f16 cache (16-bit models), the row kernel (decode; head dim 80)
/// and the tensor-core tile kernel (prefill, head dims 64, 128, 256) to their rounding, and
/// the caches themselves to the rounding of their type. Three sequences in scattered
/// blocks run a packed prefill (one of them longer than two 64-row tiles and several windows),
/// a second packed pass that continues them, and two decode steps; GQA groups of 1 to 8, full
/// and partial RoPE, none, sliding windows. In the cases marked `in place`, q, k and v are
/// column slices of one projection in the model's dtype (as the layer passes them) and the op
/// applies per-head q/k RMSNorms first, and multiplies the output by sigmoid of a gate slice of
/// the same projection (Qwen's gated attention); the GPU returns the model's dtype, so the row
/// kernel's combine gates and rounds as it writes. Every decode step that takes the fused decode
/// kernel (the append's work in the row kernel) also runs the append and the row kernel on a
/// copy of the caches: outputs and caches bit for bit equal. Every 16-bit prefill pass at d = 256
/// with GQA (two query heads a block) also runs with one head a block: outputs bit for bit equal.
pub(crate) fn gpu_paged_attention_matches_cpu(dev: &Device) {
    use deltaserve_kernels::ops::{paged_attention, AttentionShape, AttnOutput, DevicePages, Paged, PagedSeq, QkNorms, RopeArgs};
    // Passes: rows per slot (0 = not in the pass).
    const SHORT: &[[usize; 3]] = &[[70, 5, 130], [1, 64, 1], [1, 1, 1], [0, 1, 1]];
    // 38 tiles × 8 heads: more blocks than one wave of the H100 holds (one head a block, or two
    // at d = 256), so the tile kernel pairs long tiles with short ones (across the two prompts).
    const LONG: &[[usize; 3]] = &[[2100, 0, 300], [1, 0, 1]];
    // (HQ, HKV, hd, rot, window, dtype, passes, in place).
    let cases = [
        (8, 2, 256, 64, None, BF16, SHORT, false),
        (8, 2, 256, 64, None, BF16, SHORT, true),
        (4, 4, 128, 128, Some(40), DType::F16, SHORT, true),
        (6, 2, 64, 64, None, BF16, SHORT, false),
        (4, 2, 32, 32, Some(7), DType::F32, SHORT, false),
        (4, 2, 32, 32, Some(7), DType::F32, SHORT, true),
        (8, 1, 80, 0, None, DType::F32, SHORT, false),
        (2, 2, 256, 256, None, DType::F32, SHORT, false),
        (8, 2, 256, 64, Some(100), DType::F32, SHORT, false),
        (8, 2, 80, 80, None, BF16, SHORT, false),
        (4, 1, 128, 64, Some(70), BF16, SHORT, false),
        (8, 2, 128, 64, None, BF16, LONG, false),
        (8, 2, 128, 64, None, BF16, LONG, true),
        (8, 2, 256, 64, None, BF16, LONG, false),
        (8, 4, 256, 64, Some(100), DType::F16, SHORT, true),
    ];
    let (bs, width, slots) = (16usize, 160usize, 3usize);
    // Slot s's logical block j is physical block 479 − (3j + s): every table scattered.
    let tables: Vec<Vec<u32>> = (0..slots).map(|s| (0..width).map(|j| (slots * width - 1 - (3 * j + s)) as u32).collect()).collect();
    let flat: Vec<i32> = tables.iter().flatten().map(|&b| b as i32).collect();
    let dev_tables = Tensor::new(flat.as_slice(), dev).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    let (mut fused_checked, mut pairs_checked, mut wg_checked) = (0, 0, 0);
    let mut wg_worst = 0f64;
    let wg_launches = deltaserve_kernels::ops::attention_warpgroup_launches;
    for (hq, hkv, hd, rot, window, dtype, passes, in_place) in cases {
        let shape = AttentionShape { q_heads: hq, kv_heads: hkv, head_dim: hd, window, scale: (hd as f32).powf(-0.5), operands: dtype };
        let weight = |rng: &mut rand::rngs::StdRng| {
            let w: Vec<f32> = (0..hd).map(|_| rng.random_range(0.5..1.5)).collect();
            Tensor::new(w.as_slice(), &Device::Cpu).unwrap()
        };
        let (qw, kw) = (weight(&mut rng), weight(&mut rng));
        let (qw_gpu, kw_gpu) = (qw.to_device(dev).unwrap(), kw.to_device(dev).unwrap());
        let norms = |q, k| in_place.then_some(QkNorms { q, k, eps: 1e-6 });
        let inv: Vec<f32> = (0..rot / 2).map(|i| 1.0 / 10000f32.powf((2 * i) as f32 / rot as f32)).collect();
        let (inv_cpu, inv_gpu) = (Tensor::new(inv.as_slice(), &Device::Cpu).unwrap(), Tensor::new(inv.as_slice(), dev).unwrap());
        let per_block = bs * hkv * hd;
        let mut cpu_cache = (SlotBuffer::zeros(slots * width, per_block), SlotBuffer::zeros(slots * width, per_block));
        // The GPU keeps a 16-bit model's cache in its own type.
        let gpu_zeros = || SlotBuffer::zeros_on_as(slots * width, per_block, dev, dtype).unwrap();
        let mut gpu_cache = (gpu_zeros(), gpu_zeros());
        let mut seen = [0usize; 3];
        let mut worst = 0f64;
        for (p, lens) in passes.iter().enumerate() {
            let members: Vec<usize> = (0..slots).filter(|&s| lens[s] > 0).collect();
            let mut cu = vec![0];
            for &s in &members {
                cu.push(cu[cu.len() - 1] + lens[s]);
            }
            let n = cu[cu.len() - 1];
            let rand = |rng: &mut rand::rngs::StdRng, heads: usize, scale: f32| {
                let v: Vec<f32> = (0..n * heads * hd).map(|_| rng.random_range(-scale..scale)).collect();
                Tensor::from_vec(v, (n, heads, hd), &Device::Cpu).unwrap()
            };
            let (q, k, v) = (rand(&mut rng, hq, 3.0), rand(&mut rng, hkv, 1.0), rand(&mut rng, hkv, 1.0));
            // In place: [N, 8 + (2·HQ + 2·HKV)·hd] in the model's dtype, q | gate | k | v after 8
            // columns (Qwen's gated attention), the gate read on the GPU as a column slice.
            let (q, k, v, gates) = if in_place {
                let flat = |t: &Tensor, heads: usize| t.reshape((n, heads * hd)).unwrap();
                let pad = Tensor::zeros((n, 8), DType::F32, &Device::Cpu).unwrap();
                let gate = rand(&mut rng, hq, 3.0);
                let parts = [&pad, &flat(&q, hq), &flat(&gate, hq), &flat(&k, hkv), &flat(&v, hkv)];
                let proj = Tensor::cat(&parts, 1).unwrap().to_dtype(dtype).unwrap();
                let cols = |at: usize, heads: usize| proj.narrow(1, at, heads * hd).unwrap();
                let gate_cpu = cols(8 + hq * hd, hq).to_dtype(DType::F32).unwrap();
                let gate_gpu = proj.to_device(dev).unwrap().narrow(1, 8 + hq * hd, hq * hd).unwrap();
                (cols(8, hq), cols(8 + 2 * hq * hd, hkv), cols(8 + (2 * hq + hkv) * hd, hkv), Some((gate_cpu, gate_gpu)))
            } else {
                (q, k, v, None)
            };
            let seqs: Vec<PagedSeq<'_>> = members.iter().map(|&s| PagedSeq { start: seen[s], slot: s, table: &tables[s] }).collect();
            let pass = Paged { seqs: &seqs, cu: &cu, block_size: bs };
            let (mut row_slot, mut row_pos) = (vec![], vec![]);
            for (i, &s) in members.iter().enumerate() {
                for t in 0..cu[i + 1] - cu[i] {
                    row_slot.push(s as i32);
                    row_pos.push((seen[s] + t) as i32);
                }
            }
            let (rs, rp) = (Tensor::new(row_slot.as_slice(), dev).unwrap(), Tensor::new(row_pos.as_slice(), dev).unwrap());
            let pages = DevicePages { tables: &dev_tables, width, row_slot: &rs, row_pos: &rp, tiles: None };
            fn rope(inv: &Tensor, rot: usize) -> Option<RopeArgs<'_>> {
                (rot > 0).then_some(RopeArgs { inv_freq: inv, rotary_dim: rot })
            }
            let cpu_norms = norms(&qw, &kw);
            let (cpu_k, cpu_v) = (&mut cpu_cache.0, &mut cpu_cache.1);
            // The CPU's output in f32; the GPU's in the model's dtype, gated by its combine.
            let cpu_out = AttnOutput { dtype: DType::F32, gate: gates.as_ref().map(|g| &g.0) };
            let want = paged_attention((&q, &k, &v), cpu_norms, &shape, rope(&inv_cpu, rot), pass, None, (cpu_k, cpu_v), cpu_out).unwrap();
            let on = |t: &Tensor| t.to_device(dev).unwrap();
            let gpu = |caches: &mut (SlotBuffer, SlotBuffer)| {
                let gpu_out = AttnOutput { dtype, gate: gates.as_ref().map(|g| &g.1) };
                let (kc, vc) = (&mut caches.0, &mut caches.1);
                let qkv = (&on(&q), &on(&k), &on(&v));
                paged_attention(qkv, norms(&qw_gpu, &kw_gpu), &shape, rope(&inv_gpu, rot), pass, Some(pages), (kc, vc), gpu_out).unwrap()
            };
            // A decode step (one new row a sequence): the fused kernel against the append and the
            // row kernel, on a copy of the caches.
            let one_row_each = cu.windows(2).all(|w| w[1] - w[0] == 1);
            let unfused = one_row_each.then(|| {
                let mut caches = gpu_cache.clone();
                deltaserve_kernels::ops::set_fused_decode_attention(false);
                let out = gpu(&mut caches);
                deltaserve_kernels::ops::set_fused_decode_attention(true);
                (values(&out), caches)
            });
            // A 16-bit prefill: the mma.sync tile kernel on a copy of the caches, for the warpgroup
            // kernel (head dims 128 and 256, an even GQA group; sm_90a) to be compared with, and
            // at d = 256 with GQA its two query heads a block against one head a block.
            let prefill16 = !one_row_each && dtype != DType::F32;
            let tiles = |pairs: bool| {
                let mut caches = gpu_cache.clone();
                deltaserve_kernels::ops::set_attention_warpgroup(false);
                deltaserve_kernels::ops::set_attention_head_pairs(pairs);
                let out = gpu(&mut caches);
                deltaserve_kernels::ops::set_attention_head_pairs(true);
                deltaserve_kernels::ops::set_attention_warpgroup(true);
                values(&out)
            };
            let mma = prefill16.then(|| tiles(true));
            let one_head = (prefill16 && hd == 256 && (hq / hkv) % 2 == 0).then(|| tiles(false));
            let launched = wg_launches();
            let got = gpu(&mut gpu_cache);
            let what = format!("HQ {hq} HKV {hkv} hd {hd} rot {rot} window {window:?} {dtype:?} in place {in_place} pass {p}");
            if let (Some(out), Some(pairs)) = (&one_head, &mma) {
                assert!(pairs == out, "{what}: two heads a block differ from one head a block");
                pairs_checked += 1;
            }
            if let Some(out) = &mma {
                if wg_launches() > launched {
                    // The same arithmetic; only the tensor cores' order of a product's sums may differ.
                    let e = rel_err(&values(&got), out);
                    assert!(e <= 1e-3, "{what}: the warpgroup kernel is {e:.3e} from the mma.sync tile kernel");
                    wg_worst = wg_worst.max(e);
                    wg_checked += 1;
                }
            }
            if let Some((out, caches)) = &unfused {
                assert!(values(&got) == *out, "{what}: the fused decode kernel's output differs from the append and row kernel's");
                for b in 0..slots * width {
                    for (c, g) in [(&caches.0, &gpu_cache.0), (&caches.1, &gpu_cache.1)] {
                        assert!(c.slot_to_vec(b).unwrap() == g.slot_to_vec(b).unwrap(), "{what}: cache block {b} differs when fused");
                    }
                }
                fused_checked += 1;
            }
            let e = rel_err(&values(&got), &values(&want));
            // A 16-bit cache rounds k and v; the tensor cores also round q and the probabilities.
            let tol = match dtype {
                DType::F32 => 1e-5,
                DType::F16 => 3e-3,
                _ => 1.5e-2,
            };
            assert!(e <= tol, "{what}: rel err {e:.3e} > {tol:.0e}");
            worst = worst.max(e);
            for &s in &members {
                seen[s] += lens[s];
            }
        }
        // The caches agree too (keys after RoPE, values), in every block the sequences used, to
        // the rounding of the cache's type (2⁻⁹ relative for bf16, 2⁻¹² for f16).
        let cache_tol = match dtype {
            DType::F32 => 1e-6,
            DType::F16 => 3e-4,
            _ => 2.5e-3,
        };
        for (c, g) in [(&cpu_cache.0, &gpu_cache.0), (&cpu_cache.1, &gpu_cache.1)] {
            for b in 0..slots * width {
                let e = rel_err(&g.slot_to_vec(b).unwrap(), &c.slot_to_vec(b).unwrap());
                assert!(e <= cache_tol || c.slot_to_vec(b).unwrap().iter().all(|&x| x == 0.0), "cache block {b}: {e:.3e}");
            }
        }
        println!("paged attention HQ {hq} HKV {hkv} hd {hd} rot {rot} window {window:?} {dtype:?} in place {in_place}: GPU vs CPU worst rel err {worst:.2e}");
    }
    // f32 models' decode steps and 16-bit ones' with q, k and v in place take the fused kernel.
    assert!(fused_checked >= 12, "{fused_checked} decode passes compared with the fused kernel");
    println!("paged attention: {fused_checked} decode passes, the fused kernel bit for bit the append and row kernel");
    // The bf16 d = 256 GQA cases' prefill passes: the first two of SHORT each, LONG's first (152
    // two-head blocks: two tiles a block).
    assert!(pairs_checked >= 5, "{pairs_checked} prefill passes compared with two heads a block");
    println!("paged attention: {pairs_checked} prefill passes, two heads a block bit for bit one head a block");
    // Every 16-bit prefill pass at d = 128 / 256 with an even GQA group, where the device has
    // sm_90a (the H100 / H200 this suite runs on): SHORT's first two passes of four cases, LONG's
    // first of three.
    assert!(wg_checked >= 11, "{wg_checked} prefill passes compared with the warpgroup kernel");
    println!("paged attention: {wg_checked} prefill passes, the warpgroup kernel within {wg_worst:.2e} of the mma.sync tile kernel");
}

/// The conv kernels read a column slice of a wider f32, bf16 or f16 tensor in place and equal
/// the CPU's conv on the same values, outputs and the conv states of every slot. The packed
/// prefill's sequences cover every case of its 16- and 32-row tiles: empty, shorter than the
/// width W (older inputs from the previous state), exactly W, one tile, crossing tiles, and
/// several starting inside one tile; C = 200 leaves a partial block; the slice starts where the
/// four-channel kernel can take it and where only the one-channel one can; W = 4 (compiled in)
/// and W = 3 (a run-time width). Then a decode step in shuffled slot order. SwiGLU on column
/// slices equals silu(gate) · up computed in f32 and rounded once, the attention output's
/// sigmoid gate on a column slice equals the CPU's, and the logits' widening to f32 is exact, into a new
/// tensor or a fixed buffer, as is the embeddings' gather and widening.
pub(crate) fn gpu_conv_and_swiglu_match_cpu(dev: &Device) {
    use deltaserve_kernels::ops::{conv_prefill_packed, conv_step, embedding_f32, sigmoid_gate, swiglu, to_f32, to_f32_into};
    use deltaserve_kernels::ConvActivation;
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let mut rand = |shape: (usize, usize)| {
        let v: Vec<f32> = (0..shape.0 * shape.1).map(|_| rng.random_range(-1.0f32..1.0)).collect();
        Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
    };
    let (c, pool) = (200usize, 11usize);
    let lens = [33usize, 0, 1, 3, 70, 4, 31, 32, 2];
    let mut cu = vec![0usize];
    for l in lens {
        cu.push(cu[cu.len() - 1] + l);
    }
    let rows = cu[lens.len()];
    // Distinct slots, not in order, two of the pool's untouched.
    let slots: Vec<usize> = (0..lens.len()).map(|i| (i * 5 + 2) % pool).collect();
    let (x_wide, step_wide) = (rand((rows, c + 24)), rand((lens.len(), c + 24)));
    let weights = [rand((c, 4)), rand((c, 3))];
    let inits: Vec<Vec<Tensor>> = weights.iter().map(|wt| (0..pool).map(|_| rand(wt.dims2().unwrap())).collect()).collect();
    let step_slots: Vec<usize> = slots.iter().rev().copied().collect();
    // Column offset 8: rows aligned for the four-channel kernel; 3: the one-channel kernel.
    let layouts = [DType::F32, BF16, DType::F16].into_iter().flat_map(|d| [(d, 8), (d, 3)]);
    for ((dtype, offset), (weight, init)) in layouts.flat_map(|l| weights.iter().zip(&inits).map(move |wi| (l, wi))) {
        let w = weight.dim(1).unwrap();
        for act in [ConvActivation::Silu, ConvActivation::Identity] {
            let run = |device: &Device| {
                let mut states = SlotBuffer::zeros_on(pool, c * w, device).unwrap();
                for (i, s) in init.iter().enumerate() {
                    states.write_slot(i, &values(s)).unwrap();
                }
                let on = |t: &Tensor| t.to_dtype(dtype).unwrap().to_device(device).unwrap();
                let (xw, sw, wt) = (on(&x_wide), on(&step_wide), weight.to_device(device).unwrap());
                let y = conv_prefill_packed(&xw.narrow(1, offset, c).unwrap(), &wt, &mut states, &cu, &slots, act, &[], DType::F32, None)
                    .unwrap();
                let prefill_states: Vec<Vec<f32>> = (0..pool).map(|i| states.slot_to_vec(i).unwrap()).collect();
                let ys = conv_step(&sw.narrow(1, offset, c).unwrap(), &wt, &mut states, &step_slots, act).unwrap();
                let step_states: Vec<Vec<f32>> = (0..pool).map(|i| states.slot_to_vec(i).unwrap()).collect();
                (values(&y), prefill_states, values(&ys), step_states)
            };
            let (gpu, cpu) = (run(dev), run(&Device::Cpu));
            let (ey, es) = (rel_err(&gpu.0, &cpu.0), rel_err(&gpu.2, &cpu.2));
            println!("GPU conv {dtype:?} offset {offset} W={w} {act:?}: prefill rel err {ey:.2e}, step rel err {es:.2e}");
            assert!(ey <= 1e-6 && es <= 1e-6, "conv {dtype:?} offset {offset} W={w} {act:?}: prefill {ey:.3e}, step {es:.3e}");
            // States hold raw inputs: copies, equal bit for bit.
            assert_eq!(gpu.1, cpu.1, "conv states after the prefill, {dtype:?} W={w}");
            assert_eq!(gpu.3, cpu.3, "conv states after the step, {dtype:?} W={w}");
        }
    }
    // I = 256 (up at column 264): 16-byte accesses for every dtype; I = 300: bf16 and f16 take
    // the element-wise kernel.
    for i in [256usize, 300] {
        let gate_up = rand((rows, 2 * i + 8));
        for (dtype, tol) in [(DType::F32, 1e-6), (BF16, 1e-3), (DType::F16, 1e-3)] {
            let gu = gate_up.to_dtype(dtype).unwrap();
            let (g, u) = (gu.narrow(1, 0, i).unwrap(), gu.narrow(1, i + 8, i).unwrap());
            let got = swiglu(&g.to_device(dev).unwrap(), &u.to_device(dev).unwrap()).unwrap();
            assert_eq!((got.dims(), got.dtype()), (&[rows, i][..], dtype), "swiglu output shape and dtype");
            let f = |t: &Tensor| t.to_dtype(DType::F32).unwrap();
            let want = (f(&g).silu().unwrap() * f(&u)).unwrap().to_dtype(dtype).unwrap();
            let e = rel_err(&values(&got), &values(&want));
            println!("GPU swiglu {dtype:?} I={i}: rel err {e:.2e} vs f32 math rounded once");
            assert!(e <= tol, "swiglu {dtype:?} I={i}: {e:.3e}");
            // The attention output gate: o (f32) · sigmoid(gate read in place), against the
            // CPU's op on the same values.
            let o = rand((rows, i));
            let got = sigmoid_gate(&o.to_device(dev).unwrap(), &u.to_device(dev).unwrap()).unwrap();
            assert_eq!((got.dims(), got.dtype()), (&[rows, i][..], dtype), "sigmoid_gate output shape and dtype");
            let want = sigmoid_gate(&o, &u).unwrap();
            let e = rel_err(&values(&got), &values(&want));
            println!("GPU sigmoid gate {dtype:?} D={i}: rel err {e:.2e} vs the CPU");
            assert!(e <= tol, "sigmoid_gate {dtype:?} D={i}: {e:.3e}");
            // The logits' widening to f32 is exact: the same bits as the CPU's cast (rows × I a
            // multiple of 8 takes the vectorised kernel, one element fewer candle's cast).
            for len in [rows * i, rows * i - 1] {
                let x = gu.flatten_all().unwrap().narrow(0, 0, len).unwrap();
                let got = to_f32(&x.to_device(dev).unwrap()).unwrap();
                assert_eq!(got.dtype(), DType::F32, "to_f32 dtype");
                assert_eq!(values(&got), values(&x.to_dtype(DType::F32).unwrap()), "to_f32 {dtype:?} of {len}");
                // Into a fixed buffer (a decode graph's logits): the same bits, and a buffer of
                // another shape refused.
                let out = Tensor::full(f32::NAN, len, dev).unwrap();
                to_f32_into(&x.to_device(dev).unwrap(), &out).unwrap();
                assert_eq!(values(&out), values(&got), "to_f32_into {dtype:?} of {len}");
                let short = Tensor::zeros(len - 1, DType::F32, dev).unwrap();
                assert!(to_f32_into(&x.to_device(dev).unwrap(), &short).is_err(), "to_f32_into a shorter buffer");
            }
            // A step's embeddings, gathered and widened in one kernel (D a multiple of 8) or by
            // candle's gather and cast (D = 12): the CPU's gather then cast, bit for bit, with
            // repeated ids and the last row.
            for d in [i, 12] {
                let table = rand((40, d)).to_dtype(dtype).unwrap();
                let ids = Tensor::new(&[39u32, 0, 7, 7, 21, 39, 3], &Device::Cpu).unwrap();
                let got = embedding_f32(&table.to_device(dev).unwrap(), &ids.to_device(dev).unwrap()).unwrap();
                let want = table.index_select(&ids, 0).unwrap().to_dtype(DType::F32).unwrap();
                assert_eq!((got.dims(), got.dtype()), (&[7, d][..], DType::F32), "embedding_f32 shape and dtype");
                assert_eq!(values(&got), values(&want), "embedding_f32 {dtype:?} D={d}");
            }
        }
    }
}

/// The prep kernel reads β's and the gate's inputs, and the gated norm its gate, in place as
/// column slices of one projection in f32, bf16 or f16, and the norm writes each output dtype:
/// both equal the CPU ops on the same values. A gate of another shape is refused.
pub(crate) fn gpu_prep_and_gated_norm_match_cpu(dev: &Device) {
    use deltaserve_kernels::ops::{gated_rms_norm, prepare, QkLayout};
    use deltaserve_kernels::GateActivation;
    let mut rng = rand::rngs::StdRng::seed_from_u64(13);
    let mut rand = |shape: (usize, usize), lo: f32, hi: f32| {
        let v: Vec<f32> = (0..shape.0 * shape.1).map(|_| rng.random_range(lo..hi)).collect();
        Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
    };
    let (n, h, k, hv, vd) = (37usize, 2usize, 64usize, 4usize, 96usize);
    // conv: [q | k | v]; proj: 5 other columns, then a, b and the output gate z.
    let conv = rand((n, 2 * h * k + hv * vd), -1.0, 1.0);
    let proj = rand((n, 5 + 2 * hv + hv * vd), -3.0, 3.0);
    let o = rand((n * hv, vd), -1.0, 1.0).reshape((n, hv, vd)).unwrap();
    let (a_log, dt_bias) = (rand((1, hv), -1.0, 1.0).flatten_all().unwrap(), rand((1, hv), -1.0, 1.0).flatten_all().unwrap());
    let o_norm = rand((1, vd), 0.5, 1.5).flatten_all().unwrap();
    let layout = QkLayout { q_heads: h, k_heads: h, head_dim: k };
    for dtype in [DType::F32, BF16, DType::F16] {
        for neg in [false, true] {
            let run = |device: &Device| {
                let on = |t: &Tensor| t.to_device(device).unwrap();
                let p = on(&proj.to_dtype(dtype).unwrap());
                let (a, b) = (p.narrow(1, 5, hv).unwrap(), p.narrow(1, 5 + hv, hv).unwrap());
                let r = prepare(&on(&conv), layout, &b, neg, Some((&a, &on(&a_log), &on(&dt_bias)))).unwrap();
                [r.q, r.k, r.beta, r.g.unwrap()].map(|t| values(&t))
            };
            let (gpu, cpu) = (run(dev), run(&Device::Cpu));
            for (name, (g, c)) in ["q", "k", "beta", "g"].iter().zip(gpu.iter().zip(&cpu)) {
                let e = rel_err(g, c);
                println!("GPU prep {dtype:?} neg_eigval={neg} {name}: rel err {e:.2e}");
                assert!(e <= 1e-5, "prep {dtype:?} {name}: {e:.3e}");
            }
        }
        for (act, out) in
            [GateActivation::Swish, GateActivation::Sigmoid].into_iter().flat_map(|a| [(a, DType::F32), (a, BF16), (a, DType::F16)])
        {
            let run = |device: &Device, as_slice: bool| {
                let on = |t: &Tensor| t.to_device(device).unwrap();
                let z = on(&proj.to_dtype(dtype).unwrap()).narrow(1, 5 + 2 * hv, hv * vd).unwrap();
                let z = if as_slice { z } else { z.contiguous().unwrap().reshape((n, hv, vd)).unwrap() };
                let y = gated_rms_norm(&on(&o), Some(&z), &on(&o_norm), 1e-5, act, out).unwrap();
                assert_eq!((y.dims(), y.dtype()), (&[n, hv, vd][..], out), "gated norm output shape and dtype");
                values(&y)
            };
            let cpu = run(&Device::Cpu, false);
            let tol = if out == DType::F32 { 1e-5 } else { 1e-3 };
            for as_slice in [true, false] {
                let e = rel_err(&run(dev, as_slice), &cpu);
                println!("GPU gated norm z {dtype:?} (slice: {as_slice}) {act:?} -> {out:?}: rel err {e:.2e}");
                assert!(e <= tol, "gated norm z {dtype:?} {act:?} -> {out:?}: {e:.3e}");
            }
        }
    }
    let bad_z = proj.to_device(dev).unwrap().narrow(1, 0, hv * vd - 1).unwrap();
    let on = |t: &Tensor| t.to_device(dev).unwrap();
    assert!(gated_rms_norm(&on(&o), Some(&bad_z), &on(&o_norm), 1e-5, GateActivation::Swish, BF16).is_err(), "a gate of the wrong width");
}

/// The gated norm reading the bf16 mixer's bf16 rows (`gated_rms_norm_xbf16_*`) gives the bits
/// of the same rows widened to f32 first (widening is exact, and the norm computes in f32): at a
/// decode step's row counts and past 256 rows (the prefill entries keeping 4, 8 or 2 elements a
/// lane), with the gate read in place, into bf16 and f32.
pub(crate) fn gpu_gated_norm_reads_bf16_rows_as_their_widening(dev: &Device) {
    use deltaserve_kernels::ops::gated_rms_norm;
    use deltaserve_kernels::GateActivation;
    let mut rng = rand::rngs::StdRng::seed_from_u64(31);
    let mut rand = |rows: usize, cols: usize, lo: f32, hi: f32| {
        let v: Vec<f32> = (0..rows * cols).map(|_| rng.random_range(lo..hi)).collect();
        Tensor::from_vec(v, (rows, cols), dev).unwrap()
    };
    let heads = 2;
    for (tokens, vd) in [(37usize, 128usize), (301, 96), (301, 512), (301, 1024)] {
        let o = rand(tokens * heads, vd, -2.0, 2.0).to_dtype(BF16).unwrap().reshape((tokens, heads, vd)).unwrap();
        let z = rand(tokens, 3 + heads * vd, -3.0, 3.0).to_dtype(BF16).unwrap().narrow(1, 3, heads * vd).unwrap();
        let w = rand(1, vd, 0.5, 1.5).flatten_all().unwrap();
        for (act, out) in [(GateActivation::Swish, BF16), (GateActivation::Sigmoid, DType::F32)] {
            let narrow = gated_rms_norm(&o, Some(&z), &w, 1e-6, act, out).unwrap();
            let wide = gated_rms_norm(&o.to_dtype(DType::F32).unwrap(), Some(&z), &w, 1e-6, act, out).unwrap();
            let (a, b) = (values(&narrow), values(&wide));
            assert!(a.iter().any(|x| *x != 0.0), "{tokens}x{heads}x{vd}: all zeros");
            let same = a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits());
            println!("GPU gated norm of bf16 rows {tokens}x{heads}x{vd} {act:?} -> {out:?}: bit for bit the widened rows: {same}");
            assert!(same, "{tokens}x{heads}x{vd} {act:?} -> {out:?}: bf16 rows differ from their widening");
        }
    }
}

/// Prefill's row-kernel entries give a decode step's bits: 301 rows in one launch (the gated
/// norm keeping 2, 4 or 8 elements a lane, the add + RMSNorm eight a thread with its weight, past
/// 256 rows) equal the same rows in launches of 150 and 151 (the few-row entries), bit for bit,
/// for widths with and without an entry of their own; the prep kernel's fixed-K entries (four
/// rows a block) give the same bits however the rows fall into blocks, and its bf16 q and k are
/// the CPU's to bf16's rounding.
pub(crate) fn gpu_prefill_row_kernels_equal_decode_variants(dev: &Device) {
    use deltaserve_kernels::ops::{add_rms_norm, gated_rms_norm, prepare, QkLayout};
    use deltaserve_kernels::GateActivation;
    let mut rng = rand::rngs::StdRng::seed_from_u64(29);
    let mut rand = |rows: usize, cols: usize, lo: f32, hi: f32| {
        let v: Vec<f32> = (0..rows * cols).map(|_| rng.random_range(lo..hi)).collect();
        Tensor::from_vec(v, (rows, cols), &Device::Cpu).unwrap().to_device(dev).unwrap()
    };
    let n = 301usize;
    // Rows [0, 150) and [150, n) apart, joined: the few-row entries' result.
    let halves = |f: &dyn Fn(usize, usize) -> Vec<Tensor>| -> Vec<Vec<f32>> {
        let (a, b) = (f(0, 150), f(150, n - 150));
        a.iter().zip(&b).map(|(x, y)| [values(x), values(y)].concat()).collect()
    };
    for d in [100usize, 128, 256, 512, 640] {
        let (x, z, w) = (rand(n, 2 * d, -1.0, 1.0), rand(n, 2 * d, -3.0, 3.0).to_dtype(BF16).unwrap(), rand(1, d, 0.5, 1.5));
        let w = w.flatten_all().unwrap();
        for out in [DType::F32, BF16] {
            let norm = |r0: usize, len: usize| {
                let xs = x.narrow(0, r0, len).unwrap().reshape((len, 2, d)).unwrap();
                vec![gated_rms_norm(&xs, Some(&z.narrow(0, r0, len).unwrap()), &w, 1e-6, GateActivation::Swish, out).unwrap()]
            };
            assert_eq!(values(&norm(0, n)[0]), halves(&norm)[0], "gated norm D={d} -> {out:?}: 301 rows != 150 + 151");
        }
    }
    for d in [1000usize, 2048, 3072] {
        let (h, delta, w) = (rand(n, d, -2.0, 2.0), rand(n, d, -1.0, 1.0).to_dtype(BF16).unwrap(), rand(1, d, 0.5, 1.5));
        let w = w.flatten_all().unwrap();
        let norm = |r0: usize, len: usize| {
            let (r, x) = add_rms_norm(&h.narrow(0, r0, len).unwrap(), Some(&delta.narrow(0, r0, len).unwrap()), &w, 1e-6, BF16).unwrap();
            vec![r, x]
        };
        let whole: Vec<Vec<f32>> = norm(0, n).iter().map(values).collect();
        assert_eq!(whole, halves(&norm), "add + RMSNorm D={d}: 301 rows != 150 + 151");
    }
    for k in [96usize, 128, 256] {
        let (h, hv) = (2usize, 4usize);
        let conv = rand(n, 2 * h * k + hv * 64, -1.0, 1.0).to_dtype(BF16).unwrap();
        let proj = rand(n, 2 * hv, -3.0, 3.0).to_dtype(BF16).unwrap();
        let (a_log, dt_bias) = (rand(1, hv, -1.0, 1.0).flatten_all().unwrap(), rand(1, hv, -1.0, 1.0).flatten_all().unwrap());
        let layout = QkLayout { q_heads: h, k_heads: h, head_dim: k };
        let prep = |r0: usize, len: usize| {
            let (c, p) = (conv.narrow(0, r0, len).unwrap(), proj.narrow(0, r0, len).unwrap());
            let (a, b) = (p.narrow(1, 0, hv).unwrap(), p.narrow(1, hv, hv).unwrap());
            let r = prepare(&c, layout, &b, false, Some((&a, &a_log, &dt_bias))).unwrap();
            vec![r.q, r.k, r.beta, r.g.unwrap()]
        };
        let whole = prep(0, n);
        assert_eq!(whole[0].dtype(), BF16, "a bf16 conv output keeps q in bf16");
        assert_eq!(whole.iter().map(values).collect::<Vec<_>>(), halves(&prep), "prep K={k}: 301 rows != 150 + 151");
        let c = conv.to_dtype(DType::F32).unwrap().to_device(&Device::Cpu).unwrap();
        let cpu_q = deltaserve_kernels::ops::l2norm(&c.narrow(1, 0, h * k).unwrap().reshape((n, h, k)).unwrap()).unwrap();
        let e = rel_err(&values(&whole[0]), &values(&cpu_q));
        println!("GPU prep bf16 K={k}: 301 rows == 150 + 151; q vs CPU {e:.2e}");
        assert!(e <= 4e-3, "prep bf16 K={k} q vs CPU: {e:.3e}");
    }
}

/// The small-batch projection kernel (decode steps' GEMVs) equals x Wᵀ computed in f32 on the
/// CPU from the same rounded values and rounded once, for every B it takes (1..=8), x contiguous
/// and as a column slice, a small odd N, a model-sized one and one whose K is split eight ways;
/// and it declines what it does not take (B = 9, K not a multiple of 8, f32). The op that picks
/// it gives the kernel's bits up to `SMALL_BATCH_LINEAR_MAX_ROWS` rows and leaves more to the
/// GEMM. Its SwiGLU variant (the MLP's down projection) equals the SwiGLU kernel followed by
/// it, bit for bit.
#[cfg(feature = "cuda")]
pub(crate) fn gpu_small_batch_linear_matches_cpu(dev: &Device) {
    use deltaserve_kernels::cuda::gemv;
    use deltaserve_kernels::ops::{
        small_batch_linear, small_batch_swiglu_linear, swiglu, SMALL_BATCH_LINEAR_MAX_ROWS, SWIGLU_LINEAR_MAX_ROWS,
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    let mut rand = |shape: (usize, usize)| {
        let v: Vec<f32> = (0..shape.0 * shape.1).map(|_| rng.random_range(-1.0f32..1.0)).collect();
        Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
    };
    // K split over 1 (N = 37), 2 or 4 (N = 2050, B > 4 or ≤ 4) and 8 (N = 200) warps a row pair.
    for (n, k) in [(37usize, 264usize), (2050, 2048), (200, 4096)] {
        let (w, x_wide) = (rand((n, k)), rand((8, k + 16)));
        for (dtype, tol) in [(BF16, 4e-3), (DType::F16, 5e-4)] {
            let (wd, xd) = (w.to_dtype(dtype).unwrap(), x_wide.to_dtype(dtype).unwrap());
            let wg = wd.to_device(dev).unwrap();
            for b in 1..=8 {
                for offset in [0, 8] {
                    let x = xd.narrow(0, 0, b).unwrap().narrow(1, offset, k).unwrap();
                    let x = if offset == 0 { x.contiguous().unwrap() } else { x };
                    let xg = x.to_device(dev).unwrap();
                    let got = gemv(&xg, &wg).unwrap().expect("the kernel takes this input");
                    match small_batch_linear(&xg, &wg).unwrap() {
                        Some(op) if b <= SMALL_BATCH_LINEAR_MAX_ROWS => assert_eq!(values(&op), values(&got), "op B={b}"),
                        None if b > SMALL_BATCH_LINEAR_MAX_ROWS => {}
                        other => panic!("B={b}: the op ran the kernel: {}", other.is_some()),
                    }
                    let f = |t: &Tensor| t.to_dtype(DType::F32).unwrap();
                    let want = f(&x).matmul(&f(&wd).t().unwrap()).unwrap().to_dtype(dtype).unwrap();
                    assert_eq!((got.dims(), got.dtype()), (&[b, n][..], dtype));
                    let e = rel_err(&values(&got), &values(&want));
                    assert!(e <= tol, "gemv {dtype:?} B={b} N={n} K={k} offset {offset}: {e:.3e}");
                    if b == 8 && offset == 8 {
                        println!("GPU small-batch linear {dtype:?} N={n} K={k}: rel err {e:.2e} (B=8, x a column slice)");
                    }
                }
            }
        }
    }
    let on = |t: Tensor, d: DType| t.to_dtype(d).unwrap().to_device(dev).unwrap();
    let declined = [
        (on(rand((9, 64)), BF16), on(rand((16, 64)), BF16)),
        (on(rand((2, 100)), BF16), on(rand((16, 100)), BF16)),
        (on(rand((2, 64)), DType::F32), on(rand((16, 64)), DType::F32)),
    ];
    for (x, w) in &declined {
        assert!(gemv(x, w).unwrap().is_none(), "x {:?} {:?} should be left to the GEMM", x.dims(), x.dtype());
    }
    // The MLP's down projection with SwiGLU formed in the kernel: bit for bit the SwiGLU kernel
    // followed by the projection kernel, for the B it fuses, from the halves of one [gate | up]
    // row; larger B is left to the two steps.
    let (i, d) = (5632usize, 40usize);
    let (w, gu) = (rand((d, i)), rand((8, 2 * i + 8)));
    for dtype in [BF16, DType::F16] {
        let (wg, gug) = (on(w.clone(), dtype), on(gu.clone(), dtype));
        for b in 1..=8 {
            let rows = gug.narrow(0, 0, b).unwrap();
            let (gate, up) = (rows.narrow(1, 0, i).unwrap(), rows.narrow(1, i + 8, i).unwrap());
            let fused = small_batch_swiglu_linear(&gate, &up, &wg).unwrap();
            if b > SWIGLU_LINEAR_MAX_ROWS {
                assert!(fused.is_none(), "B={b} is left to SwiGLU then the projection");
                continue;
            }
            let fused = fused.expect("the kernel takes the halves of one projection");
            let apart = gemv(&swiglu(&gate, &up).unwrap(), &wg).unwrap().unwrap();
            assert_eq!((fused.dims(), fused.dtype()), (&[b, d][..], dtype));
            assert_eq!(values(&fused), values(&apart), "fused SwiGLU + projection {dtype:?} B={b}");
        }
        println!("GPU small-batch SwiGLU + projection {dtype:?} I={i}: equal bit for bit to SwiGLU then the projection (B = 1..{SWIGLU_LINEAR_MAX_ROWS})");
        // Halves with different row strides stay with the two-step path.
        let other = on(rand((2, i)), dtype);
        let gate = gug.narrow(0, 0, 2).unwrap().narrow(1, 0, i).unwrap();
        assert!(small_batch_swiglu_linear(&gate, &other, &wg).unwrap().is_none(), "gate and up with different strides");
    }
}

/// The MoE kernels (route, sort, grouped SwiGLU up, grouped down, combine) against the CPU op,
/// f32 and bf16: batches of 1, 5, 70 and 1,500 tokens, 16 experts of which each token takes 4, with
/// experts 2 and 9 given equal logits (exact ties, so the tie rule decides), with and without
/// renormalisation and the shared expert. D = 512 (two 256-wide steps a warp), I = 96 (a
/// partial step, a partial 64-column tile). 1 and 5 tokens take the GEMV kernels; 70 tokens
/// (280 rows, ~17 an expert) take the tensor-core tiles in bf16, with partial row tiles. Split
/// by whole experts over 2 and 4 calls (expert parallelism), the calls sum to the whole op.
pub(crate) fn gpu_sparse_moe_matches_cpu(dev: &Device) {
    use deltaserve_kernels::ops::{
        moe_warpgroup_launches, set_batch_invariant, set_moe_warpgroup, sparse_moe, ExpertWeights, SharedExpert,
    };
    // I = 96 keeps a prompt on the wmma tiles (the warpgroup tiles want K a multiple of 64); I =
    // 192 with 600 tokens takes the warpgroup tiles: ~150 rows an expert (a whole 128-row tile and
    // a partial one), and the second 128 h columns half past I.
    // 1,500 tokens (6,000 pairs) are sorted by three blocks, 600 by two, fewer by one.
    for (e, k, d, i, tokens) in [(16usize, 4usize, 512usize, 96usize, &[1usize, 5, 70, 1500][..]), (16, 4, 512, 192, &[600][..])] {
        let mut rng = rand::rngs::StdRng::seed_from_u64(21);
        let mut randn = |shape: &[usize], scale: f32| -> Tensor {
            let n: usize = shape.iter().product();
            let v: Vec<f32> = (0..n).map(|_| scale * (rng.random::<f32>() * 2.0 - 1.0)).collect();
            Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
        };
        let gate_up = randn(&[e, 2 * i, d], 0.08);
        let down = randn(&[e, d, i], 0.2);
        for &n in tokens {
            let x = randn(&[n, d], 1.0);
            let mut logits = randn(&[n, e], 2.0).to_vec2::<f32>().unwrap();
            for row in &mut logits {
                row[9] = row[2];
            }
            let logits = Tensor::new(logits, &Device::Cpu).unwrap();
            let (shared_out, shared_gate) = (randn(&[n, d], 1.0), randn(&[n, 1], 2.0));
            for (dtype, tol) in [(DType::F32, 1e-5), (BF16, 1e-2)] {
                for (normalise, with_shared) in [(true, true), (false, false)] {
                    let run = |device: &Device| -> Vec<f32> {
                        let t = |x: &Tensor| x.to_dtype(dtype).unwrap().to_device(device).unwrap();
                        let (gu, dn, so, sg) = (t(&gate_up), t(&down), t(&shared_out), t(&shared_gate));
                        let shared = with_shared.then_some(SharedExpert { out: &so, gate: &sg });
                        let y = sparse_moe(&t(&x), &t(&logits), ExpertWeights { gate_up: &gu, down: &dn, first: 0 }, k, normalise, shared)
                            .unwrap();
                        assert_eq!(y.dtype(), dtype);
                        values(&y)
                    };
                    let before = moe_warpgroup_launches();
                    let (gpu, cpu) = (run(dev), run(&Device::Cpu));
                    let wg = moe_warpgroup_launches() > before;
                    let err = rel_err(&gpu, &cpu);
                    println!("sparse MoE N={n} I={i} {dtype:?} normalise={normalise} shared={with_shared}: GPU vs CPU {err:.2e} (warpgroup tiles: {wg})");
                    assert!(err <= tol, "N={n} I={i} {dtype:?}: {err:.3e}");
                    if i == 192 && dtype == BF16 {
                        assert!(wg, "a bf16 prompt of {n} tokens with I = {i} took the warpgroup tiles");
                        // The same prompt on the wmma tiles: both within the bound of the CPU's.
                        set_moe_warpgroup(false);
                        let wmma = run(dev);
                        set_moe_warpgroup(true);
                        let between = rel_err(&gpu, &wmma);
                        println!("  warpgroup vs wmma tiles {between:.2e}, wmma vs CPU {:.2e}", rel_err(&wmma, &cpu));
                        assert!(between <= tol, "N={n}: warpgroup against wmma tiles {between:.3e}");
                        // Batch-invariant mode keeps the 2,400 pairs on the GEMVs: the sort's list of
                        // active experts built by two blocks.
                        set_batch_invariant(true);
                        let gemv = run(dev);
                        set_batch_invariant(false);
                        let err = rel_err(&gemv, &cpu);
                        println!("  GEMVs (batch-invariant) vs CPU {err:.2e}");
                        assert!(err <= tol, "N={n}: the GEMV path against the CPU {err:.3e}");
                    }
                    // Expert parallelism: P calls, each holding E/P whole experts (the shared expert
                    // added by the first), sum to the whole op.
                    for parts in [2usize, 4] {
                        let t = |x: &Tensor| x.to_dtype(dtype).unwrap().to_device(dev).unwrap();
                        let (gu, dn, so, sg) = (t(&gate_up), t(&down), t(&shared_out), t(&shared_gate));
                        let per = e / parts;
                        let mut sum = vec![0f32; n * d];
                        for r in 0..parts {
                            let (g, w) = (gu.narrow(0, r * per, per).unwrap(), dn.narrow(0, r * per, per).unwrap());
                            let shared = (with_shared && r == 0).then_some(SharedExpert { out: &so, gate: &sg });
                            let held = ExpertWeights { gate_up: &g, down: &w, first: r * per };
                            let y = sparse_moe(&t(&x), &t(&logits), held, k, normalise, shared).unwrap();
                            for (s, v) in sum.iter_mut().zip(values(&y)) {
                                *s += v;
                            }
                        }
                        let err = rel_err(&sum, &gpu);
                        assert!(err <= tol, "N={n} {dtype:?}: {parts} expert parallel parts summed against the whole: {err:.3e}");
                    }
                }
            }
        }
    }
}

//! The GPU start-up warm-up leaves nothing behind but loaded kernels and captured graphs:
//! every slot, snapshot slot and KV block is free again, each batch size up to the asked one
//! has its graph (as does each prefill and mixed pass shape warmed), and a prompt then decodes
//! as on an engine that never warmed up.

use candle_core::{DType, Device};
use deltaserve_engine::prefill_graph::Shape;
use deltaserve_engine::state::PoolSize;
use deltaserve_engine::{Engine, LoadOptions};
use deltaserve_tests::{model_fixtures, rel_err, values};

pub fn gpu_warm_up_leaves_the_pool_as_it_was(dev: &Device) {
    for (name, dir, _, _) in model_fixtures("gpu_warm_up_leaves_the_pool_as_it_was") {
        let opts = LoadOptions { dtype: DType::BF16, device: dev.clone(), cuda_graphs: true, ..LoadOptions::cpu(dir.to_str().unwrap()) };
        let (warm, cold) = (Engine::load(&opts).unwrap(), Engine::load(&opts).unwrap());
        // 512 tokens a slot: the warm-up's two passes of a 256-row bucket fill one slot's KV.
        let size = PoolSize { snapshots: 1, ..PoolSize::for_tokens(4, 512) };
        let (mut pw, mut pc) = (warm.new_pool_sized(size).unwrap(), cold.new_pool_sized(size).unwrap());
        // A stop set before it starts: nothing runs, nothing is held.
        let stopped = warm.warm_up(&mut pw, 128, 4, &std::sync::atomic::AtomicBool::new(true)).unwrap();
        assert!(stopped.stopped, "{name}: the warm-up says it was stopped");
        assert_eq!(
            (stopped.passes, stopped.batch_sizes, stopped.prefill_graphs, stopped.mixed_graphs),
            (0, 0, 0, 0),
            "{name}: nothing ran"
        );
        assert!(warm.cuda_graph_batches().is_empty(), "{name}: no graph captured");
        let w = warm.warm_up(&mut pw, 128, 4, &std::sync::atomic::AtomicBool::new(false)).unwrap();
        assert!(!w.stopped, "{name}: a warm-up never stopped says so");
        assert_eq!((w.passes, w.batch_sizes), (4, 4), "{name}: passes of 16, 32, 64 and 128 tokens, batch sizes 1 to 4");
        assert_eq!(warm.cuda_graph_batches(), vec![1, 2, 3, 4], "{name}: a graph for each batch size");
        // Prefill graphs (every model): buckets of 64, 128 and 256 rows, 1 to 3
        // sequences each (the fourth slot holds the padding).
        let shapes = if warm.prefill_graph_buckets().is_empty() { 0 } else { 9 };
        assert_eq!(w.prefill_graphs, shapes, "{name}: prefill graph shapes warmed");
        // Mixed graphs: 128 prompt rows (the largest mixed bucket within the 128-token budget)
        // in one piece beside 1 and 2 decode rows, in two pieces beside 1 (the fourth slot holds
        // the padding).
        let mixed: Vec<Shape> = match warm.mixed_graph_buckets().is_empty() {
            true => vec![],
            false => [(1, 1), (1, 2), (2, 1)].map(|(seqs, decode)| Shape { rows: 128, seqs, decode }).to_vec(),
        };
        assert_eq!(w.mixed_graphs, mixed.len(), "{name}: mixed graph shapes warmed");
        let captured = warm.prefill_graph_shapes();
        assert_eq!(captured.len(), shapes + mixed.len(), "{name}: each captured");
        assert!(mixed.iter().all(|m| captured.contains(m)), "{name}: {mixed:?} among {captured:?}");
        assert_eq!((pw.used(), pw.snapshots_used(), pw.kv_blocks_used()), (0, 0, 0), "{name}: everything released");
        let vocab = warm.model().config().common.vocab_size as u32;
        let prompt: Vec<u32> = (0..100u32).map(|i| (i * 31 + 7) % vocab).collect();
        let (sw, sc) = (pw.allocate().unwrap(), pc.allocate().unwrap());
        assert!(pw.reserve(sw, 110).unwrap() && pc.reserve(sc, 110).unwrap());
        let lw = values(&warm.prefill_many(&mut pw, &[(sw, &prompt)]).unwrap());
        let lc = values(&cold.prefill_many(&mut pc, &[(sc, &prompt)]).unwrap());
        assert_eq!(lw, lc, "{name}: the prompt's logits, bit for bit");
        // Decode: the warm engine replays its graph at once, the cold one runs eagerly, then
        // captures (graphs equal eager decoding within 1e-6, `gpu_decode_graphs_equal_eager_decode`).
        let mut token = 5u32 % vocab;
        for step in 0..3 {
            let dw = values(&warm.decode(&mut pw, &[(sw, token)]).unwrap());
            let dc = values(&cold.decode(&mut pc, &[(sc, token)]).unwrap());
            let e = rel_err(&dw, &dc);
            assert!(e <= 1e-6, "{name}: decode step {step}: logits rel err {e:.3e}");
            token = (token * 7 + 3) % vocab;
        }
        println!(
            "{name}: warm-up of {} passes, {} batch sizes, {} prefill and {} mixed graph shapes in {:.2} s",
            w.passes, w.batch_sizes, w.prefill_graphs, w.mixed_graphs, w.secs
        );
    }
}

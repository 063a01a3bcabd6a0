//! The prefix cache's host tier on the GPU: a snapshot spilled to page-locked host memory and
//! restored holds exactly the bits of the same snapshot kept on the device, even when the
//! device slot it was read from is overwritten right after (the copies are ordered on the
//! stream, nothing waits), and a sequence continued from either gives the same logits; also with
//! the model split over two GPUs, where the pool spills and restores every rank's replica from
//! the caller's thread.

use candle_core::{DType, Device};
use deltaserve_engine::state::{LayerCache, PoolSize};
use deltaserve_engine::{Engine, LoadOptions, SlotId, StatePool};
use deltaserve_tests::{compact_dir, values};

fn states(pool: &StatePool, slot: SlotId) -> Vec<f32> {
    let mut out = Vec::new();
    for i in 0..pool.num_layers() {
        if let LayerCache::Recurrent(s) = pool.layer(i) {
            out.extend(s.conv_state.slot_to_vec(slot.index()).unwrap());
            out.extend(s.recurrent_state.slot_to_vec(slot.index()).unwrap());
        }
    }
    out
}

pub fn gpu_host_tier_round_trips_snapshots_exactly(dev: &Device) {
    round_trips(dev, 1);
}

/// The same on two GPUs (rank 0's states compared, every rank's through the logits).
#[cfg(feature = "nccl")]
pub fn gpu_tensor_parallel_host_tier_round_trips(dev: &Device) {
    let n = super::tensor_parallel::gpus();
    if n < 2 {
        println!("SKIPPED (needs 2 GPUs): gpu_tensor_parallel_host_tier_round_trips sees {n}");
        return;
    }
    round_trips(dev, 2);
}

fn round_trips(dev: &Device, tp: usize) {
    // gdp with its states in bf16 (`--state-dtype bf16`): their bits, two a word, round trip.
    for (name, state_dtype) in [("gdn", DType::F32), ("gdp", DType::F32), ("gdp", DType::BF16)] {
        let dir = compact_dir().join(name);
        let opts = LoadOptions {
            dtype: DType::F32,
            state_dtype,
            device: dev.clone(),
            tensor_parallel_size: tp,
            ..LoadOptions::cpu(dir.to_str().unwrap())
        };
        let engine = Engine::load(&opts).unwrap();
        let vocab = engine.model().config().common.vocab_size as u32;
        let prompt: Vec<u32> = (0..100u32).map(|i| (i * 31 + 7) % vocab).collect();
        let other: Vec<u32> = (0..64u32).map(|i| (i * 17 + 3) % vocab).collect();
        let mut pool = engine.new_pool_sized(PoolSize { snapshots: 2, ..PoolSize::for_tokens(4, 256) }).unwrap();
        pool.add_host_tier(2).unwrap();
        let a = pool.allocate().unwrap();
        engine.prefill_many(&mut pool, &[(a, &prompt[..64])]).unwrap();
        let (kept, spilled) = (pool.take_snapshot().unwrap(), pool.take_snapshot().unwrap());
        pool.save(a, kept).unwrap();
        pool.save(a, spilled).unwrap();
        let h = pool.spill(spilled).unwrap().expect("a free host slot");
        // The freed device slot is taken again at once and overwritten with another sequence's
        // states, queued right behind the copy to the host.
        let b = pool.allocate().unwrap();
        engine.prefill_many(&mut pool, &[(b, &other)]).unwrap();
        let reused = pool.take_snapshot().unwrap();
        assert_eq!(reused, spilled, "{name}: the spilled slot is reused");
        pool.save(b, reused).unwrap();
        let (from_host, from_device) = (pool.allocate().unwrap(), pool.allocate().unwrap());
        pool.restore_host(h, from_host).unwrap();
        assert!(pool.restore(kept, from_device).unwrap());
        let (sh, sd) = (states(&pool, from_host), states(&pool, from_device));
        assert_eq!(sh, sd, "{name}: the host copy's states, bit for bit");
        assert_ne!(sh, states(&pool, b), "{name}: not the states written over the device slot");
        assert_eq!((pool.seen(from_host), pool.seen(from_device)), (64, 64));
        let lh = values(&engine.prefill_many(&mut pool, &[(from_host, &prompt[64..])]).unwrap());
        let ld = values(&engine.prefill_many(&mut pool, &[(from_device, &prompt[64..])]).unwrap());
        assert_eq!(lh, ld, "{name}: continued from the host copy, bit for bit");
        let (dh, dd) = (
            values(&engine.decode(&mut pool, &[(from_host, 5)]).unwrap()),
            values(&engine.decode(&mut pool, &[(from_device, 5)]).unwrap()),
        );
        assert_eq!(dh, dd, "{name}: a decode step after it");
        println!("{name} ({state_dtype:?} states) TP={tp}: host round trip of {} state values exact", sh.len());
    }
}

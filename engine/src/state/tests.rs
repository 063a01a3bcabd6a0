//! The pool's slot, block and snapshot bookkeeping.

use super::*;

fn hybrid_pool(slots: usize, blocks: usize) -> StatePool {
    let specs = [
        CacheSpec::Recurrent { conv_state: 4, recurrent_state: 8, state_dtype: DType::F32 },
        CacheSpec::Attention { kv_heads: 1, head_dim: 2, dtype: DType::F32 },
    ];
    StatePool::new_on(&specs, PoolSize { slots, snapshots: 2, kv_blocks: blocks, block_size: 4, max_seq_len: 64 }, &Device::Cpu).unwrap()
}

#[test]
fn reservations_hold_blocks_back_from_other_slots() {
    let mut p = hybrid_pool(3, 5);
    let (a, b) = (p.allocate().unwrap(), p.allocate().unwrap());
    assert!(p.reserve(a, 12).unwrap(), "3 blocks of 5");
    assert_eq!(p.kv_blocks_available(), 2);
    assert!(!p.reserve(b, 12).unwrap(), "3 more do not fit");
    assert!(p.reserve(b, 8).unwrap());
    // b may not take a's promised blocks beyond its own promise...
    assert!(matches!(p.plan(&[b.index()], &[9]), Err(EngineError::KvCacheFull { needed: 3, available: 2, .. })));
    // ...but a gets all three of its own.
    let plan = p.plan(&[a.index()], &[12]).unwrap();
    assert_eq!((plan.starts.clone(), plan.tables[0].len(), plan.cu.clone()), (vec![0], 3, vec![0, 12]));
    p.advance(&[a.index()], &[12]);
    assert_eq!((p.seen(a), p.kv_blocks_used()), (12, 3));
    p.release(a).unwrap();
    assert_eq!((p.kv_blocks_used(), p.kv_blocks_available()), (0, 3));
}

#[test]
fn forks_copy_blocks_and_positions() {
    let mut p = hybrid_pool(2, 4);
    let a = p.allocate().unwrap();
    let plan = p.plan(&[a.index()], &[5]).unwrap();
    p.advance(&[a.index()], &[5]);
    if let LayerCache::Attention(kv) = p.layer_mut(1) {
        kv.k.write_slot(plan.tables[0][1] as usize, &[7.0; 8]).unwrap();
    }
    let f = p.fork(a).unwrap().unwrap();
    assert_eq!((p.seen(f), p.kv_blocks_used()), (5, 4));
    let LayerCache::Attention(kv) = p.layer(1) else { panic!("layer 1 is attention") };
    let t = p.tables[f.index()].clone();
    assert_ne!(t, plan.tables[0], "own blocks");
    assert_eq!(kv.k.slot_to_vec(t[1] as usize).unwrap(), vec![7.0; 8]);
    assert!(p.fork(a).unwrap().is_none(), "no slot left");
}

#[test]
fn a_sequence_holds_at_most_max_seq_len_tokens() {
    let specs = [CacheSpec::Attention { kv_heads: 1, head_dim: 2, dtype: DType::F32 }];
    let mut p =
        StatePool::new_on(&specs, PoolSize { slots: 1, snapshots: 0, kv_blocks: 20, block_size: 4, max_seq_len: 8 }, &Device::Cpu).unwrap();
    let s = p.allocate().unwrap();
    assert!(p.reserve(s, 8).unwrap());
    let e = p.reserve(s, 9).unwrap_err().to_string();
    assert!(e.contains("at most 8 cached tokens"), "{e}");
    assert!(p.plan(&[s.index()], &[9]).is_err(), "the table holds 2 blocks");
    assert_eq!(p.plan(&[s.index()], &[8]).unwrap().tables[0].len(), 2);
}

#[test]
fn recurrent_models_need_no_blocks() {
    let mut p = StatePool::new(&[CacheSpec::Recurrent { conv_state: 2, recurrent_state: 2, state_dtype: DType::F32 }], 1);
    let s = p.allocate().unwrap();
    assert!(p.reserve(s, 1 << 20).unwrap());
    assert!(p.plan(&[s.index()], &[1000]).unwrap().tables.is_empty());
    assert_eq!(p.blocks_for(1000), 0);
}

#[test]
fn snapshots_share_full_blocks_and_copy_a_partial_last_one_on_restore() {
    // Blocks of 4 tokens; slot a runs 10 tokens (blocks 0..3, the last holding 2).
    let mut p = hybrid_pool(2, 8);
    let a = p.allocate().unwrap();
    let plan = p.plan(&[a.index()], &[10]).unwrap();
    p.advance(&[a.index()], &[10]);
    if let LayerCache::Recurrent(l) = p.layer_mut(0) {
        l.recurrent_state.write_slot(a.index(), &[3.0; 8]).unwrap();
    }
    if let LayerCache::Attention(kv) = p.layer_mut(1) {
        kv.k.write_slot(plan.tables[0][2] as usize, &[5.0; 8]).unwrap();
    }
    let whole = p.take_snapshot().unwrap();
    p.save(a, whole).unwrap();
    let eight = p.take_snapshot().unwrap();
    p.seal(eight, a.index(), 8);
    assert_eq!((p.snapshot_tokens(whole), p.snapshot_blocks(whole), p.snapshot_blocks(eight)), (10, 3, 2));
    assert!(p.take_snapshot().is_none(), "2 snapshot slots");
    // The sequence goes; its blocks stay with the snapshots.
    p.release(a).unwrap();
    assert_eq!((p.kv_blocks_used(), p.snapshot_kv_blocks()), (3, 3));
    // Restoring the 10-token snapshot shares two blocks and copies the partial third.
    let b = p.allocate().unwrap();
    assert!(p.restore(whole, b).unwrap());
    assert_eq!((p.seen(b), p.kv_blocks_used()), (10, 4));
    let t = p.tables[b.index()].clone();
    assert_eq!(&t[..2], &plan.tables[0][..2]);
    assert_ne!(t[2], plan.tables[0][2], "the partial block is the slot's own");
    let LayerCache::Attention(kv) = p.layer(1) else { panic!("layer 1 is attention") };
    assert_eq!(kv.k.slot_to_vec(t[2] as usize).unwrap(), vec![5.0; 8]);
    let LayerCache::Recurrent(l) = p.layer(0) else { panic!("layer 0 is recurrent") };
    assert_eq!(l.recurrent_state.slot_to_vec(b.index()).unwrap(), vec![3.0; 8]);
    // Blocks free only when nothing holds them.
    p.drop_snapshot(whole).unwrap();
    assert_eq!(p.kv_blocks_used(), 3, "blocks 0, 1 held by b and `eight`, b's copy");
    p.release(b).unwrap();
    p.drop_snapshot(eight).unwrap();
    assert_eq!((p.kv_blocks_used(), p.snapshots_used()), (0, 0));
    let c = p.allocate().unwrap();
    assert!(p.restore(eight, c).is_err(), "a dropped snapshot");
}

#[test]
fn a_snapshot_spilled_to_the_host_tier_restores_its_states_and_frees_its_slot() {
    let specs = [CacheSpec::Recurrent { conv_state: 4, recurrent_state: 8, state_dtype: DType::F32 }];
    let size = PoolSize { slots: 2, snapshots: 1, kv_blocks: 0, block_size: 4, max_seq_len: 64 };
    let mut p = StatePool::new_on(&specs, size, &Device::Cpu).unwrap();
    p.add_host_tier(1).unwrap();
    let (a, b) = (p.allocate().unwrap(), p.allocate().unwrap());
    if let LayerCache::Recurrent(s) = p.layer_mut(0) {
        s.conv_state.write_slot(a.index(), &[1.0, 2.0, 3.0, 4.0]).unwrap();
        s.recurrent_state.write_slot(a.index(), &[5.0; 8]).unwrap();
    }
    p.advance(&[a.index()], &[7]);
    let snap = p.take_snapshot().unwrap();
    p.save(a, snap).unwrap();
    let h = p.spill(snap).unwrap().expect("a free host slot");
    assert_eq!((p.snapshots_used(), p.host_snapshots_free(), p.host_snapshot_tokens(h)), (0, 0, 7));
    assert!(p.check_snapshot(snap).is_err(), "the device slot was freed");
    // The device slot is reused and overwritten; the host copy is unaffected.
    let again = p.take_snapshot().unwrap();
    p.save(b, again).unwrap();
    assert_eq!(p.spill(again).unwrap(), None, "no host slot free");
    p.restore_host(h, b).unwrap();
    assert_eq!(p.seen(b), 7);
    if let LayerCache::Recurrent(s) = p.layer(0) {
        assert_eq!(s.conv_state.slot(b.index()).unwrap(), &[1.0, 2.0, 3.0, 4.0]);
        assert_eq!(s.recurrent_state.slot(b.index()).unwrap(), &[5.0; 8]);
    }
    p.drop_host(h).unwrap();
    assert!(p.drop_host(h).is_err() && p.restore_host(h, b).is_err(), "a freed host slot");
    assert_eq!(p.host_snapshots_free(), 1);
}

#[test]
fn a_hybrid_pool_refuses_a_host_tier() {
    let mut p = hybrid_pool(2, 4);
    let err = p.add_host_tier(4).unwrap_err().to_string();
    assert!(err.contains("prefix_cache_host_memory") && err.contains("attention"), "{err}");
}

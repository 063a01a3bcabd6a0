//! CPU engine throughput: prefill tokens/s at T=2048 and decode tokens/s at batch 1 and 32,
//! for tiny-gdn (the fla fixture, or the compact one when absent) and for a random checkpoint
//! of realistic shape (D=1024, 8 layers, H=4, K=256, expand_v=2, vocab 32000).
//!
//! Run: `cargo bench -p deltaserve-benches --bench engine_cpu`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use deltaserve_engine::weights::Checkpoint;
use deltaserve_engine::{read_config, CausalLm, DType, Device, Logits, PrefillAlgo, SlotId, StatePool};

fn tiny_dir() -> PathBuf {
    let shared = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/fixtures/tiny-gdn");
    if shared.exists() {
        shared
    } else {
        eprintln!("NOTICE: ../shared/fixtures/tiny-gdn not found; benchmarking compact/gdn instead");
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/compact/gdn")
    }
}

fn load(dir: &Path) -> CausalLm {
    let cfg = read_config(dir).expect("config");
    CausalLm::load(&cfg, &Checkpoint::open(dir).expect("weights"), DType::F32, &Device::Cpu, false).expect("model")
}

fn realistic() -> (CausalLm, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = serde_json::json!({
        "model_type": "gated_deltanet", "hidden_size": 1024, "num_hidden_layers": 8, "num_heads": 4,
        "head_dim": 256, "expand_v": 2.0, "vocab_size": 32000
    });
    deltaserve_engine::synth::write_random_checkpoint(&cfg, dir.path(), DType::BF16, 0, None).expect("random checkpoint");
    (load(dir.path()), dir)
}

fn tokens(n: usize, vocab: usize) -> Vec<u32> {
    (0..n).map(|i| ((i * 7919 + 13) % vocab) as u32).collect()
}

fn bench_model(c: &mut Criterion, name: &str, m: &CausalLm) {
    let vocab = m.config().common.vocab_size;
    let mut g = c.benchmark_group(name);
    g.sample_size(10).warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(8));
    let prompt = tokens(2048, vocab);
    g.throughput(Throughput::Elements(prompt.len() as u64));
    g.bench_function("prefill_T2048", |b| {
        let mut pool = StatePool::new(&m.cache_specs(), 1);
        b.iter(|| {
            let s = pool.allocate().expect("slot");
            m.prefill(&mut pool, s, &prompt, Logits::Last, PrefillAlgo::Chunked).expect("prefill");
            pool.release(s).expect("release");
        })
    });
    for batch in [1usize, 32] {
        let mut pool = StatePool::new(&m.cache_specs(), batch);
        let slots: Vec<SlotId> = (0..batch).map(|_| pool.allocate().expect("slot")).collect();
        for &s in &slots {
            m.prefill(&mut pool, s, &tokens(16, vocab), Logits::Last, PrefillAlgo::Chunked).expect("prefill");
        }
        let step: Vec<(SlotId, u32)> = slots.iter().map(|&s| (s, 17)).collect();
        g.throughput(Throughput::Elements(batch as u64));
        g.bench_with_input(BenchmarkId::new("decode_batch", batch), &step, |b, step| b.iter(|| m.decode(&mut pool, step).expect("decode")));
    }
    g.finish();
}

fn benches(c: &mut Criterion) {
    // DELTASERVE_BENCH_MODELS=dir1,dir2 benchmarks those checkpoints instead (e.g. a model and
    // its pruned version, for a ratio measured in one run).
    if let Ok(dirs) = std::env::var("DELTASERVE_BENCH_MODELS") {
        for d in dirs.split(',').filter(|d| !d.is_empty()) {
            let name = Path::new(d).file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| d.to_owned());
            bench_model(c, &name, &load(Path::new(d)));
        }
        return;
    }
    bench_model(c, "tiny-gdn", &load(&tiny_dir()));
    let (m, _dir) = realistic();
    bench_model(c, "gdn-D1024-L8-K256", &m);
}

criterion_group!(engine, benches);
criterion_main!(engine);

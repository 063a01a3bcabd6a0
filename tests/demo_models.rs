//! The bundled demo checkpoints (`models/`): deltaserve reproduces the PyTorch training
//! model's logits on the exported weights, and `generate` produces clean text.

use std::path::{Path, PathBuf};

use deltaserve_engine::{Engine, LoadOptions, Logits};
use deltaserve_tests::{load_tensors, rel_err, values};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[test]
fn demo_logits_match_the_pytorch_training_model() {
    for name in ["gdn-demo", "gdp-demo"] {
        let engine = Engine::load(&LoadOptions::cpu(repo().join("models").join(name).to_str().unwrap())).unwrap();
        let golden = load_tensors(&repo().join(format!("tests/fixtures/demo/{name}.parity.safetensors")));
        let mut cases = 0;
        for i in 0.. {
            let Some(ids) = golden.get(&format!("case{i}.input_ids")) else {
                break;
            };
            let ids: Vec<u32> = values(ids).iter().map(|&x| x as u32).collect();
            let mut pool = engine.new_pool(1).unwrap();
            let s = pool.allocate().unwrap();
            let ours = engine.prefill(&mut pool, s, &ids, Logits::All).unwrap();
            let e = rel_err(&values(&ours), &values(&golden[&format!("case{i}.all_logits")]));
            println!("{name} case{i}: rel err {e:.2e} over {} positions", ids.len());
            assert!(e <= 1e-4, "{name} case{i}: rel err {e:.3e}");
            cases += 1;
        }
        assert!(cases >= 3, "{name}: only {cases} parity cases");
    }
}

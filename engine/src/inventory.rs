//! The tensors a checkpoint must hold for a config, in fla's current layout (model-spec.md
//! §1.2, §2.2; DeltaNet: hybrid-spec.md §2.2; fla's `attn` layers: §1.1). Used to write
//! checkpoints (random ones, pruned ones) and to check them.

use crate::config::{Family, LayerKind, MlpKind, ModelConfig};

/// Whether [`expected_tensors`] lists this config's tensors: fla's families, `attn` layers
/// included, with dense MLPs (the transformers families and MoE blocks have other names).
pub fn listed(cfg: &ModelConfig) -> bool {
    cfg.family == Family::Fla && !cfg.is_moe()
}

/// `(key, shape)` of every tensor the config implies, in a stable order (for configs that
/// [`listed`] accepts).
pub fn expected_tensors(cfg: &ModelConfig) -> Vec<(String, Vec<usize>)> {
    let c = &cfg.common;
    let (d, vocab, w) = (c.hidden_size, c.vocab_size, c.conv_size);
    let (hv, n) = (cfg.num_v_heads(), cfg.num_householder());
    let (key_dim, value_dim, i_size) = (cfg.key_dim(), cfg.value_dim(), cfg.intermediate_size());
    let mut v: Vec<(String, Vec<usize>)> = vec![("model.embeddings.weight".into(), vec![vocab, d])];
    for l in 0..c.num_hidden_layers {
        let p = |s: &str| format!("model.layers.{l}.{s}");
        v.push((p("attn_norm.weight"), vec![d]));
        let i_size = match cfg.mlps.get(l) {
            Some(MlpKind::Dense { intermediate }) => *intermediate,
            _ => i_size,
        };
        let mlp = |v: &mut Vec<(String, Vec<usize>)>| {
            v.push((p("mlp_norm.weight"), vec![d]));
            v.push((p("mlp.gate_proj.weight"), vec![i_size, d]));
            v.push((p("mlp.up_proj.weight"), vec![i_size, d]));
            v.push((p("mlp.down_proj.weight"), vec![d, i_size]));
        };
        if let Some(LayerKind::Attention(a)) = cfg.layers.get(l) {
            let (q, kv) = (a.num_heads * a.head_dim, a.num_kv_heads * a.head_dim);
            for (name, rows) in [("q_proj", q), ("k_proj", kv), ("v_proj", kv)] {
                v.push((p(&format!("attn.{name}.weight")), vec![rows, d]));
                if a.qkv_bias {
                    v.push((p(&format!("attn.{name}.bias")), vec![rows]));
                }
            }
            v.push((p("attn.o_proj.weight"), vec![d, q]));
            mlp(&mut v);
            continue;
        }
        v.push((p("attn.q_proj.weight"), vec![key_dim, d]));
        v.push((p("attn.k_proj.weight"), vec![n * key_dim, d]));
        v.push((p("attn.v_proj.weight"), vec![n * value_dim, d]));
        if cfg.use_beta() {
            v.push((p("attn.b_proj.weight"), vec![n * hv, d]));
        }
        if cfg.use_forget_gate() {
            v.push((p("attn.a_proj.weight"), vec![hv, d]));
            v.push((p("attn.A_log"), vec![hv]));
            v.push((p("attn.dt_bias"), vec![hv]));
        }
        if c.use_short_conv {
            v.push((p("attn.q_conv1d.weight"), vec![key_dim, 1, w]));
            v.push((p("attn.k_conv1d.weight"), vec![n * key_dim, 1, w]));
            v.push((p("attn.v_conv1d.weight"), vec![n * value_dim, 1, w]));
        }
        if cfg.use_output_gate() {
            v.push((p("attn.g_proj.weight"), vec![value_dim, d]));
        }
        v.push((p("attn.o_norm.weight"), vec![cfg.head_v_dim()]));
        v.push((p("attn.o_proj.weight"), vec![d, value_dim]));
        mlp(&mut v);
    }
    v.push(("model.norm.weight".into(), vec![d]));
    if !c.tie_word_embeddings {
        v.push(("lm_head.weight".into(), vec![vocab, d]));
    }
    v
}

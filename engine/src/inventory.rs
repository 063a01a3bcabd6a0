//! The tensors a checkpoint must hold for a config: fla's current layout (model-spec.md §1.2,
//! §2.2; DeltaNet: hybrid-spec.md §2.2; fla's `attn` layers: §1.1) and transformers' Qwen3.5,
//! Qwen3.5-MoE (text layouts, §3.2, §4.3), Qwen3-Next (§4.2) and OLMo-Hybrid (§5.2) layouts.
//! Used to write checkpoints (random ones, pruned ones) and to check them.

use crate::config::{AttentionSpec, Family, LayerKind, MlpKind, ModelConfig, MoeSpec, QkNorm};

/// `(key, shape)` of every tensor the config implies, in each family's own names, in a stable
/// order.
pub fn expected_tensors(cfg: &ModelConfig) -> Vec<(String, Vec<usize>)> {
    match cfg.family {
        Family::Qwen3_5 | Family::Qwen3Next => return qwen_tensors(cfg),
        Family::OlmoHybrid => return olmo_hybrid_tensors(cfg),
        Family::Fla => {}
    }
    let c = &cfg.common;
    let (d, vocab, w) = (c.hidden_size, c.vocab_size, c.conv_size);
    let (hv, n) = (cfg.num_v_heads(), cfg.num_householder());
    let (key_dim, value_dim) = (cfg.key_dim(), cfg.value_dim());
    let mut v: Vec<(String, Vec<usize>)> = vec![("model.embeddings.weight".into(), vec![vocab, d])];
    for l in 0..c.num_hidden_layers {
        let p = |s: &str| format!("model.layers.{l}.{s}");
        v.push((p("attn_norm.weight"), vec![d]));
        let i_size = intermediate(cfg, l);
        let mlp = |v: &mut Vec<(String, Vec<usize>)>| {
            v.push((p("mlp_norm.weight"), vec![d]));
            dense_mlp(v, &p("mlp"), i_size, d);
        };
        if let Some(LayerKind::Attention(a)) = cfg.layers.get(l) {
            attention_tensors(&mut v, &p("attn"), a, d);
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
    final_norm_and_head(&mut v, cfg);
    v
}

/// A dense SwiGLU MLP of width `i` under `p` (`gate_proj`, `up_proj`, `down_proj`).
fn dense_mlp(v: &mut Vec<(String, Vec<usize>)>, p: &str, i: usize, d: usize) {
    v.push((format!("{p}.gate_proj.weight"), vec![i, d]));
    v.push((format!("{p}.up_proj.weight"), vec![i, d]));
    v.push((format!("{p}.down_proj.weight"), vec![d, i]));
}

/// The final norm and, unless tied to the embeddings, the LM head.
fn final_norm_and_head(v: &mut Vec<(String, Vec<usize>)>, cfg: &ModelConfig) {
    let c = &cfg.common;
    v.push(("model.norm.weight".into(), vec![c.hidden_size]));
    if !c.tie_word_embeddings {
        v.push(("lm_head.weight".into(), vec![c.vocab_size, c.hidden_size]));
    }
}

/// A layer's dense MLP width.
fn intermediate(cfg: &ModelConfig, layer: usize) -> usize {
    match cfg.mlps.get(layer) {
        Some(MlpKind::Dense { intermediate }) => *intermediate,
        _ => cfg.intermediate_size(),
    }
}

/// transformers' self-attention tensors under `p` (`q_proj` with Qwen's output gate rows when
/// the spec has it, biases, q/k norms).
fn attention_tensors(v: &mut Vec<(String, Vec<usize>)>, p: &str, a: &AttentionSpec, d: usize) {
    let (q, kv) = (a.num_heads * a.head_dim, a.num_kv_heads * a.head_dim);
    let q_rows = if a.output_gate { 2 * q } else { q };
    for (name, rows) in [("q_proj", q_rows), ("k_proj", kv), ("v_proj", kv)] {
        v.push((format!("{p}.{name}.weight"), vec![rows, d]));
        if a.qkv_bias {
            v.push((format!("{p}.{name}.bias"), vec![rows]));
        }
    }
    v.push((format!("{p}.o_proj.weight"), vec![d, q]));
    if a.o_bias {
        v.push((format!("{p}.o_proj.bias"), vec![d]));
    }
    let norms = match a.qk_norm {
        QkNorm::None => None,
        QkNorm::PerHead => Some((a.head_dim, a.head_dim)),
        QkNorm::Whole => Some((q, kv)),
    };
    if let Some((qn, kn)) = norms {
        v.push((format!("{p}.q_norm.weight"), vec![qn]));
        v.push((format!("{p}.k_norm.weight"), vec![kn]));
    }
}

/// A sparse MoE block under `p` as transformers saves it: the router, the routed experts (packed
/// `experts.gate_up_proj` `[E, 2I, D]` and `experts.down_proj` `[E, D, I]` for Qwen3.5-MoE, one
/// `experts.{e}.*_proj` each for Qwen3-Next: `packed`), the shared expert and its gate.
fn moe_tensors(v: &mut Vec<(String, Vec<usize>)>, p: &str, m: &MoeSpec, d: usize, packed: bool) {
    let (e, i, s) = (m.num_experts, m.expert_intermediate, m.shared_intermediate);
    v.push((format!("{p}.gate.weight"), vec![e, d]));
    if packed {
        v.push((format!("{p}.experts.gate_up_proj"), vec![e, 2 * i, d]));
        v.push((format!("{p}.experts.down_proj"), vec![e, d, i]));
    } else {
        for x in 0..e {
            v.push((format!("{p}.experts.{x}.gate_proj.weight"), vec![i, d]));
            v.push((format!("{p}.experts.{x}.up_proj.weight"), vec![i, d]));
            v.push((format!("{p}.experts.{x}.down_proj.weight"), vec![d, i]));
        }
    }
    if s > 0 {
        dense_mlp(v, &format!("{p}.shared_expert"), s, d);
        v.push((format!("{p}.shared_expert_gate.weight"), vec![1, d]));
    }
}

/// Qwen3.5's and Qwen3.5-MoE's text models as `Qwen3_5ForCausalLM` / `Qwen3_5MoeForCausalLM` save
/// them (hybrid-spec.md §3.2, §4.3): fused `in_proj_qkv` and one `conv1d` over q‖k‖v in the
/// linear-attention layers, gated attention; and Qwen3-Next (§4.2), whose linear-attention
/// layers pack q, k, v, z per key-head group in `in_proj_qkvz` and b, a in `in_proj_ba`.
fn qwen_tensors(cfg: &ModelConfig) -> Vec<(String, Vec<usize>)> {
    let next = cfg.family == Family::Qwen3Next;
    let c = &cfg.common;
    let (d, vocab, w) = (c.hidden_size, c.vocab_size, c.conv_size);
    let (key_dim, value_dim, hv) = (cfg.key_dim(), cfg.value_dim(), cfg.num_v_heads());
    let conv_dim = 2 * key_dim + value_dim;
    let mut v: Vec<(String, Vec<usize>)> = vec![("model.embed_tokens.weight".into(), vec![vocab, d])];
    for l in 0..c.num_hidden_layers {
        let p = |s: &str| format!("model.layers.{l}.{s}");
        v.push((p("input_layernorm.weight"), vec![d]));
        match cfg.layers.get(l) {
            Some(LayerKind::Attention(a)) => attention_tensors(&mut v, &p("self_attn"), a, d),
            _ => {
                if next {
                    v.push((p("linear_attn.in_proj_qkvz.weight"), vec![2 * key_dim + 2 * value_dim, d]));
                    v.push((p("linear_attn.in_proj_ba.weight"), vec![2 * hv, d]));
                } else {
                    v.push((p("linear_attn.in_proj_qkv.weight"), vec![conv_dim, d]));
                    v.push((p("linear_attn.in_proj_z.weight"), vec![value_dim, d]));
                    v.push((p("linear_attn.in_proj_b.weight"), vec![hv, d]));
                    v.push((p("linear_attn.in_proj_a.weight"), vec![hv, d]));
                }
                v.push((p("linear_attn.conv1d.weight"), vec![conv_dim, 1, w]));
                v.push((p("linear_attn.A_log"), vec![hv]));
                v.push((p("linear_attn.dt_bias"), vec![hv]));
                v.push((p("linear_attn.norm.weight"), vec![cfg.head_v_dim()]));
                v.push((p("linear_attn.out_proj.weight"), vec![d, value_dim]));
            }
        }
        v.push((p("post_attention_layernorm.weight"), vec![d]));
        match cfg.mlps.get(l) {
            Some(MlpKind::Sparse(m)) => moe_tensors(&mut v, &p("mlp"), m, d, !next),
            _ => dense_mlp(&mut v, &p("mlp"), intermediate(cfg, l), d),
        }
    }
    final_norm_and_head(&mut v, cfg);
    v
}

/// OLMo-Hybrid as transformers 5.17 saves it (hybrid-spec.md §5.2): fla's projection names in the
/// linear-attention layers, whose one short conv over q‖k‖v is cut into `q/k/v_conv1d` at equal
/// thirds (`torch.chunk`'s ⌈C/3⌉ rows, the rest last), not at the q/k/v boundaries; the norms
/// under the checkpoint's names (`attention_layer_norm` / `feedforward_layer_norm` before the
/// linear-attention layers' sub-blocks, `feedforward_layer_norm` / `post_feedforward_layernorm`
/// after the attention layers').
fn olmo_hybrid_tensors(cfg: &ModelConfig) -> Vec<(String, Vec<usize>)> {
    let c = &cfg.common;
    let (d, vocab, w) = (c.hidden_size, c.vocab_size, c.conv_size);
    let (key_dim, value_dim, hv) = (cfg.key_dim(), cfg.value_dim(), cfg.num_v_heads());
    let conv_dim = 2 * key_dim + value_dim;
    let third = conv_dim.div_ceil(3);
    let mut v: Vec<(String, Vec<usize>)> = vec![("model.embed_tokens.weight".into(), vec![vocab, d])];
    for l in 0..c.num_hidden_layers {
        let p = |s: &str| format!("model.layers.{l}.{s}");
        match cfg.layers.get(l) {
            Some(LayerKind::Attention(a)) => {
                attention_tensors(&mut v, &p("self_attn"), a, d);
                v.push((p("feedforward_layer_norm.weight"), vec![d]));
                v.push((p("post_feedforward_layernorm.weight"), vec![d]));
            }
            _ => {
                v.push((p("attention_layer_norm.weight"), vec![d]));
                v.push((p("linear_attn.q_proj.weight"), vec![key_dim, d]));
                v.push((p("linear_attn.k_proj.weight"), vec![key_dim, d]));
                v.push((p("linear_attn.v_proj.weight"), vec![value_dim, d]));
                v.push((p("linear_attn.g_proj.weight"), vec![value_dim, d]));
                v.push((p("linear_attn.a_proj.weight"), vec![hv, d]));
                v.push((p("linear_attn.b_proj.weight"), vec![hv, d]));
                v.push((p("linear_attn.A_log"), vec![hv]));
                v.push((p("linear_attn.dt_bias"), vec![hv]));
                for (name, rows) in [("q_conv1d", third), ("k_conv1d", third), ("v_conv1d", conv_dim - 2 * third)] {
                    v.push((p(&format!("linear_attn.{name}.weight")), vec![rows, 1, w]));
                }
                v.push((p("linear_attn.o_norm.weight"), vec![cfg.head_v_dim()]));
                v.push((p("linear_attn.o_proj.weight"), vec![d, value_dim]));
                v.push((p("feedforward_layer_norm.weight"), vec![d]));
            }
        }
        dense_mlp(&mut v, &p("mlp"), intermediate(cfg, l), d);
    }
    final_norm_and_head(&mut v, cfg);
    v
}

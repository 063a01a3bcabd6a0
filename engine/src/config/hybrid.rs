//! Hybrid layouts: which layers are softmax attention, and how (hybrid-spec.md §1.1, §3.1,
//! §5.1). fla's `attn` field, Qwen3.5's `text_config` and OLMo-Hybrid's top-level fields all
//! become one [`LayerKind`] per layer; their linear layers become fla Gated DeltaNet fields.

use serde_json::{json, Value};

use super::moe::{self, MlpKind};
use super::{unsupported, Architecture, CommonFields, GatedDeltaNetFields};
use crate::error::ConfigError;

/// `model_type` of Qwen3.5 as released (the multimodal wrapper).
pub const QWEN3_5: &str = "qwen3_5";
/// `model_type` of Qwen3.5's text model alone.
pub const QWEN3_5_TEXT: &str = "qwen3_5_text";
/// `model_type` of OLMo-Hybrid.
pub const OLMO_HYBRID: &str = "olmo_hybrid";
/// `model_type` of Qwen3-Next (text only, MoE).
pub const QWEN3_NEXT: &str = "qwen3_next";
/// `model_type` of Qwen3.5-MoE as released (the multimodal wrapper).
pub const QWEN3_5_MOE: &str = "qwen3_5_moe";
/// `model_type` of Qwen3.5-MoE's text model alone.
pub const QWEN3_5_MOE_TEXT: &str = "qwen3_5_moe_text";

/// Which library's conventions a checkpoint follows: names, norms and block order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// fla (`gated_deltanet`, `gated_deltaproduct`, `delta_net`), with or without `attn` layers.
    Fla,
    /// transformers' Qwen3.5 and Qwen3.5-MoE: zero-centred norms `x̂·(1+w)`, fused
    /// `in_proj_qkv`, gated attention.
    Qwen3_5,
    /// transformers' Qwen3-Next: as Qwen3.5, but `in_proj_qkvz` / `in_proj_ba` packed per
    /// key-head group (§4.2), text-only keys.
    Qwen3Next,
    /// transformers' OLMo-Hybrid: fla-named GDN layers, post-norm attention blocks.
    OlmoHybrid,
}

impl Family {
    /// Decoder norms are `x̂·(1 + w)` (transformers' Qwen models).
    pub fn zero_centred(self) -> bool {
        matches!(self, Self::Qwen3_5 | Self::Qwen3Next)
    }
}

/// How an attention layer normalises q and k before RoPE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QkNorm {
    /// None (fla).
    None,
    /// Zero-centred RMSNorm per head over hd (Qwen3.5, weights `[hd]`).
    PerHead,
    /// Plain RMSNorm over the whole projection (OLMo-Hybrid, weights `[H·hd]`).
    Whole,
}

/// Rotary embedding of an attention layer: half-split pairs `(i, i + rot/2)` over the first
/// `rotary_dim` channels of each head.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RopeSpec {
    /// Base θ.
    pub theta: f64,
    /// Rotated channels per head (hd, or Qwen's partial `hd·partial_rotary_factor`).
    pub rotary_dim: usize,
}

/// One softmax-attention layer.
#[derive(Debug, Clone, PartialEq)]
pub struct AttentionSpec {
    /// HQ.
    pub num_heads: usize,
    /// HKV.
    pub num_kv_heads: usize,
    /// hd.
    pub head_dim: usize,
    /// Biases on q/k/v.
    pub qkv_bias: bool,
    /// Bias on o_proj.
    pub o_bias: bool,
    /// Sliding window (keys `i-w+1..=i`), or all earlier keys.
    pub window: Option<usize>,
    /// RoPE, or none (OLMo-Hybrid's NoPE).
    pub rope: Option<RopeSpec>,
    /// q/k normalisation.
    pub qk_norm: QkNorm,
    /// Qwen's output gate: `q_proj` yields `[q, gate]` per head and `o ⊙ σ(gate)` enters o_proj.
    pub output_gate: bool,
}

/// What a layer's token mixer is.
#[derive(Debug, Clone, PartialEq)]
pub enum LayerKind {
    /// The architecture's linear-attention mixer.
    Linear,
    /// Softmax attention with a KV cache.
    Attention(AttentionSpec),
}

pub(super) fn field<'a>(v: &'a Value, name: &str) -> Option<&'a Value> {
    v.get(name).filter(|x| !x.is_null())
}

pub(super) fn usize_or(v: &Value, name: &str, default: usize) -> Result<usize, ConfigError> {
    match field(v, name) {
        None => Ok(default),
        Some(x) => x.as_u64().map(|n| n as usize).ok_or_else(|| invalid(name, "a non-negative integer", x)),
    }
}

fn f64_or(v: &Value, name: &str, default: f64) -> Result<f64, ConfigError> {
    match field(v, name) {
        None => Ok(default),
        Some(x) => x.as_f64().ok_or_else(|| invalid(name, "a number", x)),
    }
}

pub(super) fn bool_or(v: &Value, name: &str, default: bool) -> Result<bool, ConfigError> {
    match field(v, name) {
        None => Ok(default),
        Some(x) => x.as_bool().ok_or_else(|| invalid(name, "true or false", x)),
    }
}

pub(super) fn invalid(name: &str, expected: &str, actual: impl ToString) -> ConfigError {
    ConfigError::Invalid { field: name.into(), expected: expected.into(), actual: actual.to_string() }
}

/// An entry of a list of layer indices (`attn.layers`, `mlp_only_layers`), below `layers`.
pub(super) fn layer_index(i: &Value, layers: usize, name: &str) -> Result<usize, ConfigError> {
    i.as_u64()
        .map(|i| i as usize)
        .filter(|&i| i < layers)
        .ok_or_else(|| invalid(name, &format!("layer indices below num_hidden_layers ({layers})"), i))
}

pub(super) fn positive(name: &str, v: usize) -> Result<usize, ConfigError> {
    if v == 0 {
        return Err(invalid(name, "> 0", 0));
    }
    Ok(v)
}

/// fla's `attn` field: `null`, one dict or a list of dicts with disjoint `layers` (§1.1).
pub fn fla_layers(attn: Option<&Value>, layers: usize, hidden_size: usize) -> Result<Vec<LayerKind>, ConfigError> {
    let mut kinds = vec![LayerKind::Linear; layers];
    let specs: Vec<&Value> = match attn {
        None | Some(Value::Null) => return Ok(kinds),
        Some(Value::Array(a)) => a.iter().collect(),
        Some(o @ Value::Object(_)) => vec![o],
        Some(other) => return Err(invalid("attn", "null, an object or a list of objects", other)),
    };
    for s in specs {
        let heads = positive(
            "attn.num_heads",
            field(s, "num_heads").and_then(Value::as_u64).ok_or(ConfigError::Missing("attn.num_heads"))? as usize,
        )?;
        let kv = positive("attn.num_kv_heads", usize_or(s, "num_kv_heads", heads)?)?;
        if heads % kv != 0 {
            return Err(invalid("attn.num_kv_heads", &format!("a divisor of attn.num_heads ({heads})"), kv));
        }
        if !hidden_size.is_multiple_of(heads) {
            return Err(invalid("attn.num_heads", &format!("a divisor of hidden_size ({hidden_size})"), heads));
        }
        let head_dim = hidden_size / heads;
        let window = match field(s, "window_size") {
            None => None,
            Some(w) => {
                Some(w.as_u64().filter(|&w| w > 0).ok_or_else(|| invalid("attn.window_size", "null or a positive integer", w))? as usize)
            }
        };
        let spec = AttentionSpec {
            num_heads: heads,
            num_kv_heads: kv,
            head_dim,
            qkv_bias: bool_or(s, "qkv_bias", false)?,
            o_bias: false,
            window,
            rope: Some(RopeSpec { theta: f64_or(s, "rope_theta", 10000.0)?, rotary_dim: head_dim }),
            // fla's get_attention never passes qk_norm (§1.1): the layer has none.
            qk_norm: QkNorm::None,
            output_gate: false,
        };
        let Some(Value::Array(idx)) = s.get("layers") else { return Err(ConfigError::Missing("attn.layers")) };
        for i in idx {
            let i = layer_index(i, layers, "attn.layers")?;
            if kinds[i] != LayerKind::Linear {
                return Err(invalid("attn.layers", "each layer listed once", i));
            }
            kinds[i] = LayerKind::Attention(spec.clone());
        }
    }
    Ok(kinds)
}

/// `layer_types` (legacy names mapped as transformers does), or the family's default rule.
fn layer_types(text: &Value, layers: usize, default_full: impl Fn(usize) -> bool) -> Result<Vec<bool>, ConfigError> {
    let Some(types) = field(text, "layer_types") else { return Ok((0..layers).map(default_full).collect()) };
    let types = types.as_array().ok_or_else(|| invalid("layer_types", "a list", types))?;
    if types.len() != layers {
        return Err(invalid("layer_types", &format!("{layers} entries (num_hidden_layers)"), types.len()));
    }
    types
        .iter()
        .map(|t| match t.as_str() {
            Some("full_attention" | "attention") => Ok(true),
            Some("linear_attention" | "mamba" | "conv") => Ok(false),
            _ => Err(unsupported("layer_types", t, "`full_attention` or `linear_attention`")),
        })
        .collect()
}

/// `rope_parameters` (or the legacy top-level fields): `Ok(None)` only for an explicit null θ.
fn rope(text: &Value, head_dim: usize, default_partial: f64, explicit_null_is_nope: bool) -> Result<Option<RopeSpec>, ConfigError> {
    let params = text.get("rope_parameters");
    let nested = params.filter(|p| p.is_object());
    if let Some(p) = nested {
        if let Some(t) = field(p, "rope_type").and_then(Value::as_str).filter(|t| *t != "default") {
            return Err(unsupported("rope_parameters.rope_type", t, "`default`"));
        }
    }
    let theta_value = nested.and_then(|p| p.get("rope_theta")).or_else(|| text.get("rope_theta"));
    let nope =
        explicit_null_is_nope && (theta_value.is_some_and(Value::is_null) || (params.is_some_and(Value::is_null) && theta_value.is_none()));
    if nope {
        return Ok(None);
    }
    let theta = match theta_value.filter(|v| !v.is_null()) {
        None => 10000.0,
        Some(v) => v.as_f64().filter(|t| *t > 0.0).ok_or_else(|| invalid("rope_theta", "a positive number", v))?,
    };
    let partial = match nested.and_then(|p| field(p, "partial_rotary_factor")).or_else(|| field(text, "partial_rotary_factor")) {
        None => default_partial,
        Some(v) => v.as_f64().filter(|f| *f > 0.0 && *f <= 1.0).ok_or_else(|| invalid("partial_rotary_factor", "in (0, 1]", v))?,
    };
    let rotary_dim = (head_dim as f64 * partial) as usize;
    if rotary_dim == 0 || !rotary_dim.is_multiple_of(2) {
        return Err(invalid("partial_rotary_factor", &format!("head_dim ({head_dim}) × factor to be a positive even number"), partial));
    }
    Ok(Some(RopeSpec { theta, rotary_dim }))
}

/// A transformers hybrid (Qwen3.5 or OLMo-Hybrid) parsed into fla GDN fields plus layer kinds.
pub struct Parsed {
    /// The linear layers as fla Gated DeltaNet fields.
    pub common: CommonFields,
    /// GDN specifics (GVA heads, swish output gate).
    pub arch: Architecture,
    /// One entry per layer.
    pub layers: Vec<LayerKind>,
    /// Which conventions.
    pub family: Family,
    /// Each layer's channel mixer.
    pub mlps: Vec<MlpKind>,
}

/// Defaults of one family's text config (transformers 5.17).
struct Defaults {
    hidden: usize,
    layers: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    intermediate: usize,
    vocab: usize,
    max_positions: usize,
}

const QWEN3_5_DEFAULTS: Defaults =
    Defaults { hidden: 4096, layers: 32, heads: 16, kv_heads: 4, head_dim: 256, intermediate: 12288, vocab: 248320, max_positions: 32768 };
const QWEN3_5_MOE_DEFAULTS: Defaults =
    Defaults { hidden: 2048, layers: 40, heads: 16, kv_heads: 2, head_dim: 256, intermediate: 12288, vocab: 248320, max_positions: 32768 };
const QWEN3_NEXT_DEFAULTS: Defaults =
    Defaults { hidden: 2048, layers: 48, heads: 16, kv_heads: 2, head_dim: 256, intermediate: 5632, vocab: 151936, max_positions: 32768 };

/// Parses `qwen3_5` / `qwen3_5_text` (hybrid-spec.md §3.1), `qwen3_5_moe` /
/// `qwen3_5_moe_text` and `qwen3_next` (§4.1), and `olmo_hybrid` (§5.1).
pub fn parse(raw: &Value, model_type: &str) -> Result<Parsed, ConfigError> {
    let family = match model_type {
        OLMO_HYBRID => Family::OlmoHybrid,
        QWEN3_NEXT => Family::Qwen3Next,
        _ => Family::Qwen3_5,
    };
    let moe_everywhere = matches!(model_type, QWEN3_5_MOE | QWEN3_5_MOE_TEXT);
    let text = if family == Family::Qwen3_5 { raw.get("text_config").filter(|t| t.is_object()).unwrap_or(raw) } else { raw };
    let text_types: &[&str] =
        if moe_everywhere { &[QWEN3_5_MOE, QWEN3_5_MOE_TEXT] } else { &[QWEN3_5, QWEN3_5_TEXT, OLMO_HYBRID, QWEN3_NEXT] };
    if let Some(t) = field(text, "model_type").and_then(Value::as_str).filter(|t| !text_types.contains(t)) {
        let expected: Vec<String> = text_types.iter().map(|t| format!("`{t}`")).collect();
        return Err(unsupported("text_config.model_type", t, &expected.join(" or ")));
    }
    if family == Family::Qwen3_5 && !moe_everywhere {
        for key in ["num_experts", "moe_intermediate_size"] {
            if let Some(v) = field(text, key) {
                return Err(unsupported(key, v, "a dense model under `qwen3_5` (MoE checkpoints say `qwen3_5_moe`)"));
            }
        }
    }
    let olmo = family == Family::OlmoHybrid;
    let def = match family {
        Family::Qwen3Next => &QWEN3_NEXT_DEFAULTS,
        _ if moe_everywhere => &QWEN3_5_MOE_DEFAULTS,
        _ => &QWEN3_5_DEFAULTS,
    };
    let d = positive("hidden_size", usize_or(text, "hidden_size", if olmo { 3840 } else { def.hidden })?)?;
    let layers = positive("num_hidden_layers", usize_or(text, "num_hidden_layers", def.layers)?)?;
    let hq = positive("num_attention_heads", usize_or(text, "num_attention_heads", if olmo { 30 } else { def.heads })?)?;
    let hkv = positive("num_key_value_heads", usize_or(text, "num_key_value_heads", if olmo { hq } else { def.kv_heads })?)?;
    if hq % hkv != 0 {
        return Err(invalid("num_key_value_heads", &format!("a divisor of num_attention_heads ({hq})"), hkv));
    }
    let hd = positive("head_dim", usize_or(text, "head_dim", if olmo { d / hq } else { def.head_dim })?)?;
    let hk = positive("linear_num_key_heads", usize_or(text, "linear_num_key_heads", if olmo { hq } else { 16 })?)?;
    let hv = positive("linear_num_value_heads", usize_or(text, "linear_num_value_heads", if olmo { hq } else { 32 })?)?;
    let dk = positive(
        "linear_key_head_dim",
        usize_or(text, "linear_key_head_dim", if olmo { (0.75 * d as f64 / hk as f64) as usize } else { 128 })?,
    )?;
    let dv = positive("linear_value_head_dim", usize_or(text, "linear_value_head_dim", if olmo { 2 * dk } else { 128 })?)?;
    if family == Family::Qwen3Next && hv % hk != 0 {
        return Err(invalid("linear_num_value_heads", &format!("a multiple of linear_num_key_heads ({hk})"), hv));
    }
    let intermediate = positive("intermediate_size", usize_or(text, "intermediate_size", if olmo { 11008 } else { def.intermediate })?)?;
    let mlps = match family {
        Family::Qwen3Next => moe::parse(text, layers, intermediate, false)?,
        _ if moe_everywhere => moe::parse(text, layers, intermediate, true)?,
        _ => vec![MlpKind::Dense { intermediate }; layers],
    };
    let act = field(text, "hidden_act").and_then(Value::as_str).unwrap_or("silu");
    if !matches!(act, "silu" | "swish") {
        return Err(unsupported("hidden_act", act, "`silu`"));
    }
    let full = if olmo {
        let mut t = layer_types(text, layers, |i| i % 4 == 3)?;
        if field(text, "layer_types").is_none() && !t.contains(&true) {
            t[layers - 1] = true;
        }
        t
    } else {
        let interval = positive("full_attention_interval", usize_or(text, "full_attention_interval", 4)?)?;
        layer_types(text, layers, |i| (i + 1) % interval == 0)?
    };
    let bias = bool_or(text, "attention_bias", false)?;
    let spec = AttentionSpec {
        num_heads: hq,
        num_kv_heads: hkv,
        head_dim: hd,
        qkv_bias: bias,
        o_bias: bias,
        window: None,
        rope: rope(text, hd, if olmo { 1.0 } else { 0.25 }, olmo)?,
        qk_norm: if olmo { QkNorm::Whole } else { QkNorm::PerHead },
        output_gate: !olmo,
    };
    let kinds = full.iter().map(|&f| if f { LayerKind::Attention(spec.clone()) } else { LayerKind::Linear }).collect();
    // The text-only class ties by text_config's flag, the wrapper by the top-level one (§3.2).
    let tie = bool_or(raw, "tie_word_embeddings", false)?
        || (!std::ptr::eq(text, raw) && bool_or(text, "tie_word_embeddings", false)? && raw.get("tie_word_embeddings").is_none());
    let eos = field(text, "eos_token_id").or_else(|| field(raw, "eos_token_id")).cloned().unwrap_or(if olmo {
        json!(100257)
    } else {
        Value::Null
    });
    let common: CommonFields = serde_json::from_value(json!({
        "hidden_size": d,
        "head_dim": dk,
        "num_heads": hk,
        "expand_v": dv as f64 / dk as f64,
        "use_short_conv": true,
        "conv_size": positive("linear_conv_kernel_dim", usize_or(text, "linear_conv_kernel_dim", 4)?)?,
        "max_position_embeddings": usize_or(text, "max_position_embeddings", if olmo { 65536 } else { def.max_positions })?,
        "intermediate_size": intermediate,
        "hidden_act": "swish",
        "num_hidden_layers": layers,
        "norm_eps": f64_or(text, "rms_norm_eps", 1e-6)?,
        "vocab_size": positive("vocab_size", usize_or(text, "vocab_size", if olmo { 100352 } else { def.vocab })?)?,
        "tie_word_embeddings": tie,
        "allow_neg_eigval": olmo && bool_or(text, "linear_allow_neg_eigval", true)?,
        "bos_token_id": field(text, "bos_token_id").cloned(),
        "eos_token_id": eos,
    }))
    .map_err(|e| ConfigError::Json(e.to_string()))?;
    let mut common = common;
    common.value_head_dim = Some(dv);
    let arch =
        Architecture::GatedDeltaNet(GatedDeltaNetFields { num_v_heads: Some(hv), use_gate: true, output_gate_activation: "swish".into() });
    Ok(Parsed { common, arch, layers: kinds, family, mlps })
}

#[cfg(test)]
mod tests {
    use crate::config::{LayerKind, ModelConfig, QkNorm};

    #[test]
    fn qwen3_5_defaults_and_layer_types_from_the_interval() {
        let c = ModelConfig::from_json_str(r#"{"model_type":"qwen3_5","text_config":{"num_hidden_layers":8,"full_attention_interval":4}}"#)
            .unwrap();
        let full: Vec<usize> = c.layers.iter().enumerate().filter(|(_, l)| matches!(l, LayerKind::Attention(_))).map(|(i, _)| i).collect();
        assert_eq!(full, vec![3, 7]);
        let LayerKind::Attention(a) = &c.layers[3] else { unreachable!() };
        assert_eq!((a.num_heads, a.num_kv_heads, a.head_dim, a.qk_norm, a.output_gate), (16, 4, 256, QkNorm::PerHead, true));
        assert_eq!(a.rope.unwrap().rotary_dim, 64, "partial_rotary_factor 0.25 of 256");
        assert_eq!((c.num_heads(), c.num_v_heads(), c.head_k_dim(), c.head_v_dim()), (16, 32, 128, 128));
        assert!(!c.common.allow_neg_eigval);
    }

    #[test]
    fn olmo_rope_is_off_only_for_an_explicit_null() {
        let parse =
            |extra: &str| ModelConfig::from_json_str(&format!(r#"{{"model_type":"olmo_hybrid","num_hidden_layers":4{extra}}}"#)).unwrap();
        let rope = |c: &ModelConfig| match &c.layers[3] {
            LayerKind::Attention(a) => a.rope,
            LayerKind::Linear => panic!("layer 3 is attention by default"),
        };
        assert!(rope(&parse(r#","rope_parameters":null"#)).is_none());
        assert!(rope(&parse(r#","rope_theta":null"#)).is_none());
        assert_eq!(rope(&parse("")).unwrap().theta, 10000.0);
        assert_eq!(rope(&parse(r#","rope_parameters":{"rope_type":"default","rope_theta":5e5}"#)).unwrap().theta, 5e5);
        let c = parse("");
        assert!(c.common.allow_neg_eigval && c.linear_norm_eps() == 1e-5);
        assert_eq!((c.head_k_dim(), c.head_v_dim()), (96, 192));
    }

    #[test]
    fn moe_layers_follow_mlp_only_layers_and_the_sparse_step() {
        use crate::config::{MlpKind, MoeSpec};
        let c = ModelConfig::from_json_str(
            r#"{"model_type":"qwen3_next","num_hidden_layers":6,"num_experts":8,"num_experts_per_tok":2,"decoder_sparse_step":2,"mlp_only_layers":[3],"norm_topk_prob":false,"intermediate_size":96}"#,
        )
        .unwrap();
        let sparse = MoeSpec { num_experts: 8, top_k: 2, expert_intermediate: 512, shared_intermediate: 512, norm_topk_prob: false };
        let dense = MlpKind::Dense { intermediate: 96 };
        // Sparse where (i + 1) % 2 == 0, except layer 3.
        assert_eq!(c.mlps, vec![dense, MlpKind::Sparse(sparse), dense, dense, dense, MlpKind::Sparse(sparse)]);
        assert_eq!((c.model_type(), c.common.vocab_size, c.common.hidden_size), ("qwen3_next", 151936, 2048));
        // Qwen3.5-MoE: every layer sparse, weights always renormalised, its own defaults.
        let c = ModelConfig::from_json_str(r#"{"model_type":"qwen3_5_moe","text_config":{"num_hidden_layers":2,"norm_topk_prob":false}}"#)
            .unwrap();
        let spec = MoeSpec { num_experts: 256, top_k: 8, expert_intermediate: 512, shared_intermediate: 512, norm_topk_prob: true };
        assert_eq!(c.mlps, vec![MlpKind::Sparse(spec); 2]);
        assert_eq!((c.model_type(), c.common.vocab_size), ("qwen3_5_moe", 248320));
    }

    #[test]
    fn refusals_name_the_field() {
        let e = ModelConfig::from_json_str(r#"{"model_type":"qwen3_5","text_config":{"num_experts":8}}"#).unwrap_err().to_string();
        assert!(e.contains("`num_experts`") && e.contains("qwen3_5_moe"), "{e}");
        let e =
            ModelConfig::from_json_str(r#"{"model_type":"qwen3_next","num_experts":4,"num_experts_per_tok":5}"#).unwrap_err().to_string();
        assert!(e.contains("`num_experts_per_tok`") && e.contains("at most num_experts (4)") && e.contains('5'), "{e}");
        let e = ModelConfig::from_json_str(r#"{"model_type":"qwen3_next","num_hidden_layers":4,"mlp_only_layers":[4]}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("`mlp_only_layers`") && e.contains("below num_hidden_layers (4)"), "{e}");
        let e =
            ModelConfig::from_json_str(r#"{"model_type":"qwen3_5_text","rope_parameters":{"rope_type":"yarn"}}"#).unwrap_err().to_string();
        assert!(e.contains("`rope_parameters.rope_type`") && e.contains("yarn"), "{e}");
        let e = ModelConfig::from_json_str(r#"{"model_type":"qwen3_5_text","num_hidden_layers":2,"layer_types":["full_attention"]}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("`layer_types`") && e.contains("2 entries"), "{e}");
        let e = ModelConfig::from_json_str(r#"{"model_type":"gated_deltanet","hidden_size":64,"attn":{"layers":[0],"num_heads":3}}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("`attn.num_heads`") && e.contains("hidden_size (64)"), "{e}");
    }
}

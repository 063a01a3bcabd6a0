//! `config.json` → typed, validated model configuration: fla's fields (model-spec.md §1.1,
//! §2.1) and, in [`hybrid`], the layer kinds of hybrid models.

use serde::Deserialize;
use serde_json::Value;

use crate::error::ConfigError;

pub mod hybrid;
pub mod moe;
pub use hybrid::{AttentionSpec, Family, LayerKind, QkNorm, RopeSpec};
pub use moe::{MlpKind, MoeSpec};

/// `model_type` of fla's Gated DeltaNet.
pub const GATED_DELTANET: &str = "gated_deltanet";
/// `model_type` of fla's Gated DeltaProduct.
pub const GATED_DELTAPRODUCT: &str = "gated_deltaproduct";
/// `model_type` of fla's DeltaNet.
pub const DELTA_NET: &str = "delta_net";

fn default_hidden_size() -> usize {
    2048
}
fn default_expand_v() -> f64 {
    2.0
}
fn default_head_dim() -> usize {
    256
}
fn default_num_heads() -> usize {
    6
}
fn default_true() -> bool {
    true
}
fn default_conv_size() -> usize {
    4
}
fn default_max_position_embeddings() -> usize {
    2048
}
fn default_hidden_ratio() -> Option<f64> {
    Some(4.0)
}
fn default_hidden_act() -> String {
    "swish".into()
}
fn default_num_hidden_layers() -> usize {
    21
}
fn default_norm_eps() -> f64 {
    1e-6
}
fn default_vocab_size() -> usize {
    32000
}
fn default_bos() -> Option<u32> {
    Some(1)
}
fn default_eos() -> Option<Value> {
    Some(Value::from(2))
}
fn default_swish() -> String {
    "swish".into()
}
fn default_num_householder() -> usize {
    1
}

/// Fields shared by both architectures, spelled as in fla's `config.json` (0.6.0 defaults).
#[derive(Debug, Clone, Deserialize)]
pub struct CommonFields {
    /// D.
    #[serde(default = "default_hidden_size")]
    pub hidden_size: usize,
    /// Vd = int(head_dim · expand_v).
    #[serde(default = "default_expand_v")]
    pub expand_v: f64,
    /// K, the q/k head dim.
    #[serde(default = "default_head_dim")]
    pub head_dim: usize,
    /// H, the q/k heads.
    #[serde(default = "default_num_heads")]
    pub num_heads: usize,
    /// Depthwise causal conv + SiLU on q, k, v.
    #[serde(default = "default_true")]
    pub use_short_conv: bool,
    /// W, the conv width.
    #[serde(default = "default_conv_size")]
    pub conv_size: usize,
    /// Only used by hybrid attention layers; kept as the default context limit.
    #[serde(default = "default_max_position_embeddings")]
    pub max_position_embeddings: usize,
    /// MLP size rule input when `intermediate_size` is null.
    #[serde(default = "default_hidden_ratio")]
    pub hidden_ratio: Option<f64>,
    /// Explicit MLP size I.
    #[serde(default)]
    pub intermediate_size: Option<usize>,
    /// MLP activation: `swish` (SwiGLU) is supported.
    #[serde(default = "default_hidden_act")]
    pub hidden_act: String,
    /// Layers.
    #[serde(default = "default_num_hidden_layers")]
    pub num_hidden_layers: usize,
    /// eps of every RMSNorm, the layer's o_norm included.
    #[serde(default = "default_norm_eps")]
    pub norm_eps: f64,
    /// fla's hybrid softmax-attention layers (parsed into [`ModelConfig::layers`]).
    #[serde(default)]
    pub attn: Option<Value>,
    /// "Attention residuals"; must be null.
    #[serde(default)]
    pub attnres_block_size: Option<Value>,
    /// Legacy (pre v0.1.0) block layout switch; only `false` is supported.
    #[serde(default)]
    pub norm_first: Option<bool>,
    /// Vocabulary size.
    #[serde(default = "default_vocab_size")]
    pub vocab_size: usize,
    /// `lm_head.weight` is `model.embeddings.weight`.
    #[serde(default)]
    pub tie_word_embeddings: bool,
    /// β = 2·sigmoid(b) when true.
    #[serde(default)]
    pub allow_neg_eigval: bool,
    /// BOS id.
    #[serde(default = "default_bos")]
    pub bos_token_id: Option<u32>,
    /// EOS id or list of ids.
    #[serde(default = "default_eos")]
    pub eos_token_id: Option<Value>,
    /// fused residual+norm: same math, the residual is rounded to the activation dtype.
    #[serde(default = "default_true")]
    pub fuse_norm: bool,
    /// Vd when a family states it outright (transformers' `linear_value_head_dim`).
    #[serde(skip)]
    pub value_head_dim: Option<usize>,
}

/// Gated DeltaNet specifics (§1.1).
#[derive(Debug, Clone, Deserialize)]
pub struct GatedDeltaNetFields {
    /// HV; null → H.
    #[serde(default)]
    pub num_v_heads: Option<usize>,
    /// Output gate (g_proj + gated norm).
    #[serde(default = "default_true")]
    pub use_gate: bool,
    /// `swish`/`silu` or `sigmoid`.
    #[serde(default = "default_swish")]
    pub output_gate_activation: String,
}

/// Gated DeltaProduct specifics (§2.1).
#[derive(Debug, Clone, Deserialize)]
pub struct GatedDeltaProductFields {
    /// Output gate (g_proj + gated norm).
    #[serde(default = "default_true")]
    pub use_output_gate: bool,
    /// a_proj / A_log / dt_bias present and g applied.
    #[serde(default)]
    pub use_forget_gate: bool,
    /// n_h, householder steps per token.
    #[serde(default = "default_num_householder")]
    pub num_householder: usize,
}

fn default_one() -> f64 {
    1.0
}
fn default_silu() -> String {
    "silu".into()
}
fn default_l2() -> String {
    "l2".into()
}

/// DeltaNet specifics (hybrid-spec.md §2.1, fla 0.6.0 defaults). Its head sizes come from
/// `expand_k`/`expand_v` relative to D; parsing turns them into [`CommonFields`]' `head_dim` and
/// `expand_v` (Vd = head_dim · expand_v), so the rest of the engine reads one convention.
#[derive(Debug, Clone, Deserialize)]
pub struct DeltaNetFields {
    /// key_dim = D · expand_k.
    #[serde(default = "default_one")]
    pub expand_k: f64,
    /// value_dim = D · expand_v (DeltaNet's meaning, before normalisation).
    #[serde(default = "default_one")]
    pub expand_v: f64,
    /// β = sigmoid(b_proj x); false: β ≡ 1 and no `b_proj`.
    #[serde(default = "default_true")]
    pub use_beta: bool,
    /// Output gate (g_proj + gated norm, swish).
    #[serde(default)]
    pub use_gate: bool,
    /// `silu` (applied with the conv), `relu`, `elu` (elu + 1) or `identity`.
    #[serde(default = "default_silu")]
    pub qk_activation: String,
    /// `l2` or `sum` (L1) normalisation of q and k per head.
    #[serde(default = "default_l2")]
    pub qk_norm: String,
}

/// Which architecture, with its specific fields.
#[derive(Debug, Clone)]
pub enum Architecture {
    /// `gated_deltanet`.
    GatedDeltaNet(GatedDeltaNetFields),
    /// `gated_deltaproduct`.
    GatedDeltaProduct(GatedDeltaProductFields),
    /// `delta_net`.
    DeltaNet(DeltaNetFields),
}

/// Activation of the output gate.
pub use deltaserve_kernels::GateActivation;

/// A validated model configuration.
#[derive(Debug, Clone)]
pub struct ModelConfig {
    /// Fields shared by both architectures.
    pub common: CommonFields,
    /// Architecture-specific fields.
    pub arch: Architecture,
    /// The original JSON, kept so a rewritten checkpoint preserves unknown keys.
    pub raw: Value,
    /// Whose conventions the checkpoint follows.
    pub family: Family,
    /// Each layer's token mixer kind.
    pub layers: Vec<LayerKind>,
    /// Each layer's channel mixer kind (fla: dense, of [`ModelConfig::intermediate_size`]).
    pub mlps: Vec<MlpKind>,
}

fn unsupported(field: &str, value: impl ToString, supported: &str) -> ConfigError {
    ConfigError::Unsupported { field: field.into(), value: value.to_string(), supported: supported.into() }
}

impl ModelConfig {
    /// Parses and validates `config.json` text.
    pub fn from_json_str(text: &str) -> Result<Self, ConfigError> {
        let raw: Value = serde_json::from_str(text).map_err(|e| ConfigError::Json(e.to_string()))?;
        Self::from_value(raw)
    }

    /// Parses and validates a `config.json` value.
    pub fn from_value(raw: Value) -> Result<Self, ConfigError> {
        let model_type = raw.get("model_type").and_then(Value::as_str).ok_or(ConfigError::Missing("model_type"))?;
        let json = |e: serde_json::Error| ConfigError::Json(e.to_string());
        if matches!(
            model_type,
            hybrid::QWEN3_5
                | hybrid::QWEN3_5_TEXT
                | hybrid::OLMO_HYBRID
                | hybrid::QWEN3_NEXT
                | hybrid::QWEN3_5_MOE
                | hybrid::QWEN3_5_MOE_TEXT
        ) {
            let p = hybrid::parse(&raw, model_type)?;
            let cfg = Self { common: p.common, arch: p.arch, raw, family: p.family, layers: p.layers, mlps: p.mlps };
            cfg.validate()?;
            return Ok(cfg);
        }
        if model_type == DELTA_NET {
            let d: DeltaNetFields = serde_json::from_value(raw.clone()).map_err(json)?;
            // DeltaNet's own defaults for the shared fields, then its sizes in GDN's convention.
            let mut with_defaults = raw.clone();
            if let Some(o) = with_defaults.as_object_mut() {
                for (k, v) in [("num_heads", Value::from(16)), ("num_hidden_layers", Value::from(24))] {
                    o.entry(k).or_insert(v);
                }
            }
            let mut common: CommonFields = serde_json::from_value(with_defaults).map_err(json)?;
            let (k, v) = delta_net_head_dims(&common, &d)?;
            common.head_dim = k;
            common.expand_v = v as f64 / k as f64;
            let layers = hybrid::fla_layers(common.attn.as_ref(), common.num_hidden_layers, common.hidden_size)?;
            let cfg = Self { common, arch: Architecture::DeltaNet(d), raw, family: Family::Fla, layers, mlps: vec![] }.with_dense_mlps();
            cfg.validate()?;
            return Ok(cfg);
        }
        let common: CommonFields = serde_json::from_value(raw.clone()).map_err(json)?;
        let arch = match model_type {
            GATED_DELTANET => {
                Architecture::GatedDeltaNet(serde_json::from_value(raw.clone()).map_err(|e| ConfigError::Json(e.to_string()))?)
            }
            GATED_DELTAPRODUCT => {
                Architecture::GatedDeltaProduct(serde_json::from_value(raw.clone()).map_err(|e| ConfigError::Json(e.to_string()))?)
            }
            other => {
                return Err(unsupported(
                    "model_type",
                    other,
                    "`gated_deltanet`, `gated_deltaproduct`, `delta_net`, `qwen3_5`, `qwen3_5_text`, `qwen3_5_moe`, `qwen3_5_moe_text`, `qwen3_next` or `olmo_hybrid`",
                ))
            }
        };
        let layers = hybrid::fla_layers(common.attn.as_ref(), common.num_hidden_layers, common.hidden_size)?;
        let cfg = Self { common, arch, raw, family: Family::Fla, layers, mlps: vec![] }.with_dense_mlps();
        cfg.validate()?;
        Ok(cfg)
    }

    /// fla's models: every layer a dense MLP of [`Self::intermediate_size`].
    fn with_dense_mlps(mut self) -> Self {
        self.mlps = vec![MlpKind::Dense { intermediate: self.intermediate_size() }; self.common.num_hidden_layers];
        self
    }

    /// Whether any layer is a sparse MoE block.
    pub fn is_moe(&self) -> bool {
        self.mlps.iter().any(|m| matches!(m, MlpKind::Sparse(_)))
    }

    /// Rejects anything this engine cannot compute exactly.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let c = &self.common;
        if let Some(a) = c.attnres_block_size.as_ref().filter(|a| !a.is_null()) {
            return Err(unsupported("attnres_block_size", a, "null"));
        }
        if c.norm_first == Some(true) {
            return Err(unsupported("norm_first", true, "false (the pre-v0.1.0 norm_first layout is not supported)"));
        }
        if !matches!(c.hidden_act.as_str(), "swish" | "silu") {
            return Err(unsupported("hidden_act", &c.hidden_act, "`swish`"));
        }
        for (field, v) in [
            ("hidden_size", c.hidden_size),
            ("head_dim", c.head_dim),
            ("num_heads", c.num_heads),
            ("num_hidden_layers", c.num_hidden_layers),
            ("vocab_size", c.vocab_size),
            ("conv_size", c.conv_size),
        ] {
            if v == 0 {
                return Err(ConfigError::Invalid { field: field.into(), expected: "> 0".into(), actual: "0".into() });
            }
        }
        let vd = c.head_dim as f64 * c.expand_v;
        // DeltaNet's value size was checked when its expand_v was turned into this convention.
        let vd_ok = matches!(self.arch, Architecture::DeltaNet(_)) || c.value_head_dim.is_some() || (vd.fract() == 0.0 && vd >= 1.0);
        if !vd_ok {
            return Err(ConfigError::Invalid {
                field: "expand_v".into(),
                expected: format!("head_dim ({}) × expand_v to be a positive integer", c.head_dim),
                actual: format!("{} (→ {vd})", c.expand_v),
            });
        }
        if !(c.norm_eps > 0.0 && c.norm_eps.is_finite()) {
            return Err(ConfigError::Invalid {
                field: "norm_eps".into(),
                expected: "a positive finite number".into(),
                actual: c.norm_eps.to_string(),
            });
        }
        match &self.arch {
            Architecture::GatedDeltaNet(g) => {
                let hv = self.num_v_heads();
                if hv < c.num_heads || !hv.is_multiple_of(c.num_heads) {
                    return Err(ConfigError::Invalid {
                        field: "num_v_heads".into(),
                        expected: format!("a positive multiple of num_heads ({})", c.num_heads),
                        actual: hv.to_string(),
                    });
                }
                if !matches!(g.output_gate_activation.as_str(), "swish" | "silu" | "sigmoid") {
                    return Err(unsupported("output_gate_activation", &g.output_gate_activation, "`swish`, `silu` or `sigmoid`"));
                }
            }
            Architecture::GatedDeltaProduct(p) => {
                if p.num_householder == 0 {
                    return Err(ConfigError::Invalid { field: "num_householder".into(), expected: ">= 1".into(), actual: "0".into() });
                }
            }
            Architecture::DeltaNet(d) => {
                if !matches!(d.qk_activation.as_str(), "silu" | "relu" | "elu" | "identity") {
                    return Err(unsupported("qk_activation", &d.qk_activation, "`silu`, `relu`, `elu` or `identity`"));
                }
                if !matches!(d.qk_norm.as_str(), "l2" | "sum") {
                    return Err(unsupported("qk_norm", &d.qk_norm, "`l2` or `sum`"));
                }
            }
        }
        if c.intermediate_size == Some(0) {
            return Err(ConfigError::Invalid { field: "intermediate_size".into(), expected: "> 0".into(), actual: "0".into() });
        }
        Ok(())
    }

    /// `model_type` string.
    pub fn model_type(&self) -> &'static str {
        match self.family {
            Family::Qwen3_5 if self.is_moe() => return hybrid::QWEN3_5_MOE,
            Family::Qwen3_5 => return hybrid::QWEN3_5,
            Family::Qwen3Next => return hybrid::QWEN3_NEXT,
            Family::OlmoHybrid => return hybrid::OLMO_HYBRID,
            Family::Fla => {}
        }
        match self.arch {
            Architecture::GatedDeltaNet(_) => GATED_DELTANET,
            Architecture::GatedDeltaProduct(_) => GATED_DELTAPRODUCT,
            Architecture::DeltaNet(_) => DELTA_NET,
        }
    }
    /// H.
    pub fn num_heads(&self) -> usize {
        self.common.num_heads
    }
    /// HV (GVA value heads; GDP always H).
    pub fn num_v_heads(&self) -> usize {
        match &self.arch {
            Architecture::GatedDeltaNet(g) => g.num_v_heads.unwrap_or(self.common.num_heads),
            Architecture::GatedDeltaProduct(_) | Architecture::DeltaNet(_) => self.common.num_heads,
        }
    }
    /// K.
    pub fn head_k_dim(&self) -> usize {
        self.common.head_dim
    }
    /// Vd = int(K · expand_v); DeltaNet: D · expand_v / H (validated to divide).
    pub fn head_v_dim(&self) -> usize {
        if let Some(v) = self.common.value_head_dim {
            return v;
        }
        match &self.arch {
            Architecture::DeltaNet(d) => (self.common.hidden_size as f64 * d.expand_v) as usize / self.common.num_heads,
            _ => (self.common.head_dim as f64 * self.common.expand_v) as usize,
        }
    }
    /// H·K.
    pub fn key_dim(&self) -> usize {
        self.num_heads() * self.head_k_dim()
    }
    /// HV·Vd.
    pub fn value_dim(&self) -> usize {
        self.num_v_heads() * self.head_v_dim()
    }
    /// Householder steps per token n (1 for GDN).
    pub fn num_householder(&self) -> usize {
        match &self.arch {
            Architecture::GatedDeltaNet(_) | Architecture::DeltaNet(_) => 1,
            Architecture::GatedDeltaProduct(p) => p.num_householder,
        }
    }
    /// Whether a_proj / A_log / dt_bias exist (always for GDN, never for DeltaNet).
    pub fn use_forget_gate(&self) -> bool {
        match &self.arch {
            Architecture::GatedDeltaNet(_) => true,
            Architecture::GatedDeltaProduct(p) => p.use_forget_gate,
            Architecture::DeltaNet(_) => false,
        }
    }
    /// Whether `b_proj` exists (DeltaNet's `use_beta`; always for the gated models).
    pub fn use_beta(&self) -> bool {
        match &self.arch {
            Architecture::DeltaNet(d) => d.use_beta,
            _ => true,
        }
    }
    /// Whether the output is gated by g_proj.
    pub fn use_output_gate(&self) -> bool {
        match &self.arch {
            Architecture::GatedDeltaNet(g) => g.use_gate,
            Architecture::GatedDeltaProduct(p) => p.use_output_gate,
            Architecture::DeltaNet(d) => d.use_gate,
        }
    }
    /// Activation of the output gate.
    pub fn gate_activation(&self) -> GateActivation {
        match &self.arch {
            Architecture::GatedDeltaNet(g) if g.output_gate_activation == "sigmoid" => GateActivation::Sigmoid,
            _ => GateActivation::Swish,
        }
    }
    /// MLP size I: explicit, or `256·ceil(int(D·ratio·2/3)/256)` (fla `GatedMLP`).
    pub fn intermediate_size(&self) -> usize {
        if let Some(i) = self.common.intermediate_size {
            return i;
        }
        let ratio = self.common.hidden_ratio.unwrap_or(4.0);
        let i = (self.common.hidden_size as f64 * ratio * 2.0 / 3.0) as usize;
        i.div_ceil(256) * 256
    }
    /// Channels of the concatenated pre-conv input `[q | k | v]`: K·H + n·(K·H + Vd·HV).
    pub fn conv_channels(&self) -> usize {
        self.key_dim() + self.num_householder() * (self.key_dim() + self.value_dim())
    }
    /// EOS ids from the config (a number or a list).
    pub fn eos_token_ids(&self) -> Vec<u32> {
        ids_of(self.common.eos_token_id.as_ref())
    }
    /// Whether any layer is softmax attention.
    pub fn is_hybrid(&self) -> bool {
        self.layers.iter().any(|l| matches!(l, LayerKind::Attention(_)))
    }
    /// Layers with the linear-attention mixer.
    pub fn num_linear_layers(&self) -> usize {
        self.layers.iter().filter(|l| **l == LayerKind::Linear).count()
    }
    /// eps of the linear layers' gated output norm: OLMo-Hybrid fixes it at 1e-5 (§5.5).
    pub fn linear_norm_eps(&self) -> f64 {
        if self.family == Family::OlmoHybrid {
            1e-5
        } else {
            self.common.norm_eps
        }
    }
    /// Recurrent state elements per sequence per layer: HV·K·Vd.
    pub fn recurrent_state_len(&self) -> usize {
        self.num_v_heads() * self.head_k_dim() * self.head_v_dim()
    }
    /// Bytes of state (conv + recurrent, fp32) per sequence across the linear layers.
    pub fn state_bytes_per_sequence(&self) -> usize {
        let per_layer = self.conv_channels() * self.common.conv_size + self.recurrent_state_len();
        per_layer * self.num_linear_layers() * std::mem::size_of::<f32>()
    }
}

/// DeltaNet's per-head sizes (K, V) = (D·expand_k / H, D·expand_v / H), each a positive integer.
fn delta_net_head_dims(c: &CommonFields, d: &DeltaNetFields) -> Result<(usize, usize), ConfigError> {
    let per_head = |field: &str, expand: f64| {
        let dim = c.hidden_size as f64 * expand;
        let ok = dim.fract() == 0.0 && dim >= 1.0 && c.num_heads > 0 && (dim as usize).is_multiple_of(c.num_heads);
        if !ok {
            return Err(ConfigError::Invalid {
                field: field.into(),
                expected: format!("hidden_size ({}) × {field} to be a positive multiple of num_heads ({})", c.hidden_size, c.num_heads),
                actual: format!("{expand} (→ {dim})"),
            });
        }
        Ok(dim as usize / c.num_heads)
    };
    Ok((per_head("expand_k", d.expand_k)?, per_head("expand_v", d.expand_v)?))
}

/// Reads a token id or list of ids from a JSON value.
pub(crate) fn ids_of(v: Option<&Value>) -> Vec<u32> {
    match v {
        Some(Value::Number(n)) => n.as_u64().map(|x| vec![x as u32]).unwrap_or_default(),
        Some(Value::Array(a)) => a.iter().filter_map(Value::as_u64).map(|x| x as u32).collect(),
        _ => vec![],
    }
}

#[cfg(test)]
mod tests;

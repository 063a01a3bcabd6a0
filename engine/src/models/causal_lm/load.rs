//! Building a [`CausalLm`] from a checkpoint, whole or cut into tensor parallel ranks, with each
//! family's tensor names (fla; transformers' Qwen3.5 and OLMo-Hybrid, hybrid-spec.md §3.2,
//! §5.2).

use candle_core::{DType, Device};
use candle_nn::Linear;

use super::CausalLm;
use crate::config::{Architecture, Family, LayerKind, MlpKind, ModelConfig};
use crate::error::Result;
use crate::models::attention::Attention;
use crate::models::block::{Block, ChannelMixer, NormPlacement, TokenMixer};
use crate::models::delta_net::DeltaNet;
use crate::models::gated_deltanet::GatedDeltaNet;
use crate::models::gated_deltaproduct::GatedDeltaProduct;
use crate::models::mlp::Mlp;
use crate::models::moe::SparseMoe;
use crate::models::norm::RmsNorm;
use crate::tensor_parallel::GroupLink;
use crate::weights::{Checkpoint, Weights};

impl CausalLm {
    /// Builds the model from a checkpoint, in `dtype` on `device`.
    pub fn load(cfg: &ModelConfig, ckpt: &Checkpoint, dtype: DType, device: &Device, check_weights: bool) -> Result<Self> {
        log_skipped(ckpt);
        let root = Weights::new(ckpt, dtype, device, check_weights);
        let m = body(cfg, ckpt, &root);
        let layers = (0..cfg.common.num_hidden_layers).map(|i| load_block(cfg, &m, i)).collect::<Result<Vec<_>>>()?;
        Self::assemble(cfg, ckpt, &root, layers, dtype, device)
    }

    /// Every rank's model of a tensor parallel split: `ranks[r]` is rank r's link to the group
    /// and its device. Each layer is read from the checkpoint once, into host memory, cut into
    /// the ranks' slices (as [`Self::shard`] cuts) and each slice copied to its rank's device,
    /// while the next layer is read; embeddings, norms and the LM head are read onto every
    /// device. No device holds more than its rank's slices, and host memory a few layers.
    pub fn load_ranks(
        cfg: &ModelConfig,
        ckpt: &Checkpoint,
        dtype: DType,
        ranks: &[(GroupLink, Device)],
        check_weights: bool,
    ) -> Result<Vec<Self>> {
        log_skipped(ckpt);
        let host = Weights::new(ckpt, dtype, &Device::Cpu, check_weights);
        let m = body(cfg, ckpt, &host);
        let n = cfg.common.num_hidden_layers;
        let mut layers: Vec<Vec<Block>> = ranks.iter().map(|_| Vec::with_capacity(n)).collect();
        std::thread::scope(|s| -> Result<()> {
            // The next layer is read while this one is cut and copied (host memory holds at
            // most three); a failed read ends the reading, a failed copy drops the channel.
            let (tx, rx) = std::sync::mpsc::sync_channel::<Result<Block>>(1);
            let m = &m;
            s.spawn(move || {
                for i in 0..n {
                    let block = load_block(cfg, m, i);
                    let failed = block.is_err();
                    if tx.send(block).is_err() || failed {
                        break;
                    }
                }
            });
            for whole in rx {
                let whole = whole?;
                // The ranks' slices are cut and copied at once (each copy to its own GPU).
                let slices = std::thread::scope(|s| {
                    let jobs: Vec<_> = ranks.iter().map(|(link, dev)| s.spawn(|| whole.shard(link.clone())?.to_device(dev))).collect();
                    jobs.into_iter()
                        .map(|j| j.join().unwrap_or_else(|_| Err(crate::tensor_parallel::rank_panicked("loading a layer"))))
                        .collect::<Vec<_>>()
                });
                for (rank, slice) in layers.iter_mut().zip(slices) {
                    rank.push(slice?);
                }
            }
            Ok(())
        })?;
        ranks
            .iter()
            .zip(layers)
            .map(|((_, dev), layers)| Self::assemble(cfg, ckpt, &Weights::new(ckpt, dtype, dev, check_weights), layers, dtype, dev))
            .collect()
    }

    /// The model around `layers`: embeddings, final norm and LM head read from `root`.
    fn assemble(
        cfg: &ModelConfig,
        ckpt: &Checkpoint,
        root: &Weights<'_>,
        layers: Vec<Block>,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let (d, vocab) = (cfg.common.hidden_size, cfg.common.vocab_size);
        let fla = cfg.family == Family::Fla;
        let m = body(cfg, ckpt, root);
        let embeddings = m.pp(if fla { "embeddings" } else { "embed_tokens" }).get(&[vocab, d], "weight")?;
        let tied = cfg.common.tie_word_embeddings || (!fla && !ckpt.contains("lm_head.weight"));
        let lm_head = if tied { embeddings.clone() } else { root.get(&[vocab, d], "lm_head.weight")? };
        Ok(Self {
            cfg: cfg.clone(),
            embeddings,
            layers,
            norm: load_norm(cfg, &m, &["norm"])?,
            lm_head: Linear::new(lm_head, None),
            dtype,
            device: device.clone(),
            state_dtype: DType::F32,
        })
    }
}

/// Logs the tensors a text model does not read.
fn log_skipped(ckpt: &Checkpoint) {
    let skipped = ckpt.names().iter().filter(|n| n.starts_with("model.visual.") || n.starts_with("mtp.")).count();
    if skipped > 0 {
        tracing::info!(
            tensors = skipped,
            "skipping the vision tower (`model.visual.*`) and multi-token-prediction head (`mtp.*`): text only"
        );
    }
}

/// The decoder's tensors: `model.language_model.*` in Qwen3.5's multimodal wrapper, else `model.*`.
fn body<'a>(cfg: &ModelConfig, ckpt: &Checkpoint, root: &Weights<'a>) -> Weights<'a> {
    match cfg.family {
        Family::Qwen3_5 if ckpt.contains("model.language_model.embed_tokens.weight") => root.pp("model.language_model"),
        _ => root.pp("model"),
    }
}

/// A decoder RMSNorm under the first of `names` the checkpoint has (zero-centred for the
/// families that store `w` of `x̂·(1 + w)`).
fn load_norm(cfg: &ModelConfig, w: &Weights<'_>, names: &[&str]) -> Result<RmsNorm> {
    let (d, eps) = (cfg.common.hidden_size, cfg.common.norm_eps);
    let name = names.iter().find(|n| w.contains(&format!("{n}.weight"))).unwrap_or(&names[0]);
    if cfg.family.zero_centred() {
        RmsNorm::load_zero_centred(&w.pp(name), d, eps)
    } else {
        RmsNorm::load(&w.pp(name), d, eps)
    }
}

/// Layer `i` of the decoder `m`, with each family's names (hybrid-spec.md §3.2, §5.2).
fn load_block(cfg: &ModelConfig, m: &Weights<'_>, i: usize) -> Result<Block> {
    let (d, eps) = (cfg.common.hidden_size, cfg.common.norm_eps);
    let fla = cfg.family == Family::Fla;
    let (kind, mlp) = (&cfg.layers[i], &cfg.mlps[i]);
    let l = m.pp("layers").pp(i);
    let (mixer, placement, attn_norm, mlp_norm) = match (cfg.family, kind) {
        (Family::Fla, _) => ("attn", NormPlacement::Pre, vec!["attn_norm"], vec!["mlp_norm"]),
        (Family::OlmoHybrid, LayerKind::Attention(_)) => (
            "self_attn",
            NormPlacement::Post,
            vec!["post_attention_layernorm", "feedforward_layer_norm"],
            vec!["post_feedforward_layernorm"],
        ),
        (_, LayerKind::Attention(_)) => ("self_attn", NormPlacement::Pre, vec!["input_layernorm"], vec!["post_attention_layernorm"]),
        (_, LayerKind::Linear) => (
            "linear_attn",
            NormPlacement::Pre,
            vec!["input_layernorm", "attention_layer_norm"],
            vec!["post_attention_layernorm", "feedforward_layer_norm"],
        ),
    };
    let w = l.pp(mixer);
    let attn = match (kind, &cfg.arch) {
        (LayerKind::Attention(spec), _) => TokenMixer::Attention(Attention::load(spec, &w, d, eps, cfg.family.zero_centred())?),
        (LayerKind::Linear, _) if !fla => TokenMixer::GatedDeltaNet(GatedDeltaNet::load_transformers(cfg, &w)?),
        (LayerKind::Linear, Architecture::GatedDeltaNet(_)) => TokenMixer::GatedDeltaNet(GatedDeltaNet::load(cfg, &w)?),
        (LayerKind::Linear, Architecture::GatedDeltaProduct(_)) => TokenMixer::GatedDeltaProduct(GatedDeltaProduct::load(cfg, &w)?),
        (LayerKind::Linear, Architecture::DeltaNet(_)) => TokenMixer::DeltaNet(DeltaNet::load(cfg, &w)?),
    };
    Ok(Block {
        layer_idx: i,
        placement,
        attn_norm: load_norm(cfg, &l, &attn_norm)?,
        attn,
        mlp_norm: load_norm(cfg, &l, &mlp_norm)?,
        mlp: match mlp {
            MlpKind::Dense { intermediate } => ChannelMixer::Mlp(Mlp::load(&l.pp("mlp"), d, *intermediate)?),
            MlpKind::Sparse(spec) => ChannelMixer::Moe(SparseMoe::load(&l.pp("mlp"), spec, d)?),
        },
        tp: None,
    })
}

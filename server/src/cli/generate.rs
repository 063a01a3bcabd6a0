//! `deltaserve generate`: stream one completion to stdout.

use std::time::Instant;

use clap::Args;
use deltaserve_engine::{IncrementalDecoder, Logits, Sampler, SamplingParams};

use super::ModelArgs;

/// Generate a continuation of a prompt and stream it to stdout.
#[derive(Debug, Args)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub(crate) model: ModelArgs,
    /// The prompt text.
    #[arg(long)]
    prompt: String,
    /// Tokens to generate at most.
    #[arg(long, default_value_t = 64)]
    max_tokens: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.7)]
    temperature: f32,
    /// Nucleus sampling mass in (0, 1].
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// Keep the k most likely tokens; 0 is off.
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    /// Drop tokens below min_p × the top probability; 0 is off.
    #[arg(long, default_value_t = 0.0)]
    min_p: f32,
    /// HF-style repetition penalty; 1 is off.
    #[arg(long, default_value_t = 1.0)]
    repetition_penalty: f32,
    /// RNG seed: the same seed gives the same text.
    #[arg(long)]
    seed: Option<u64>,
    /// Keep generating after an EOS token.
    #[arg(long)]
    ignore_eos: bool,
}

/// Runs the subcommand.
pub fn run(args: GenerateArgs) -> anyhow::Result<()> {
    let engine = args.model.load()?;
    let params = SamplingParams {
        temperature: args.temperature,
        top_p: args.top_p,
        top_k: args.top_k,
        min_p: args.min_p,
        repetition_penalty: args.repetition_penalty,
        seed: args.seed,
        ..SamplingParams::default()
    };
    params.validate(engine.config().common.vocab_size)?;
    let prompt = engine.encode(&args.prompt)?;
    let mut sampler = Sampler::new(params, &prompt);
    let mut pool = engine.new_pool(1)?;
    let slot = pool.allocate().ok_or_else(|| anyhow::anyhow!("empty state pool"))?;
    let t0 = Instant::now();
    let mut logits = engine.prefill(&mut pool, slot, &prompt, Logits::Last)?.to_vec1::<f32>()?;
    let prefill_s = t0.elapsed().as_secs_f64();
    let mut out = std::io::stdout().lock();
    // A closed stdout stops the generation quietly.
    let mut open = super::write_out(&mut out, &args.prompt)?;
    let mut dec = IncrementalDecoder::new();
    let eos = &engine.tokenizer().eos_token_ids;
    let t1 = Instant::now();
    let mut generated = 0;
    for _ in 0..args.max_tokens {
        if !open {
            break;
        }
        let tok = deltaserve_engine::sampling::draw_one(&mut sampler, &logits, 0, None)?.token;
        sampler.accept(tok);
        generated += 1;
        if !args.ignore_eos && eos.contains(&tok) {
            break;
        }
        if let Some(text) = dec.push(engine.tokenizer(), tok)? {
            open = super::write_out(&mut out, &text)?;
        }
        logits = engine.decode(&mut pool, &[(slot, tok)])?.squeeze(0)?.to_vec1::<f32>()?;
    }
    let tail = dec.flush(engine.tokenizer())?.unwrap_or_default();
    if open {
        super::write_out(&mut out, &format!("{tail}\n"))?;
    }
    let decode_s = t1.elapsed().as_secs_f64();
    tracing::info!(
        prompt_tokens = prompt.len(),
        generated,
        prefill_tok_s = format!("{:.0}", prompt.len() as f64 / prefill_s),
        decode_tok_s = format!("{:.1}", generated as f64 / decode_s.max(1e-9)),
        "done"
    );
    Ok(())
}

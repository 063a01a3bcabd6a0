//! The `deltaserve` command line: serve, generate, evaluate and make checkpoints.

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;

mod cli;

#[derive(Debug, Parser)]
#[command(name = "deltaserve", version, about = "Inference server for Gated DeltaNet and Gated DeltaProduct language models")]
struct Cli {
    /// Log as JSON lines instead of text.
    #[arg(long, global = true, env = "DELTASERVE_LOG_JSON")]
    log_json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the OpenAI-compatible HTTP API with continuous batching.
    Serve(cli::serve::ServeArgs),
    /// Generate a continuation of a prompt and stream it to stdout.
    Generate(cli::generate::GenerateArgs),
    /// Evaluate a model (perplexity).
    Eval(cli::eval::EvalArgs),
    /// Remove key/query channels per head: a smaller recurrent state (DRRQR, S-Wanda, L1, Rand).
    Prune(cli::prune::PruneArgs),
    /// Write a randomly initialised checkpoint of any shape (fla's layouts and Qwen3.5's).
    InitRandom(cli::init_random::InitRandomArgs),
}

impl Command {
    /// GPUs the command splits its model over (1 where it loads none, or does not split it).
    fn tensor_parallel_size(&self) -> usize {
        match self {
            Command::Serve(a) => a.model.tensor_parallel_size.into(),
            Command::Generate(a) => a.model.tensor_parallel_size.into(),
            Command::Eval(a) => a.model().tensor_parallel_size.into(),
            Command::Prune(_) | Command::InitRandom(_) => 1,
        }
    }
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // Before any CUDA call, while this is the only thread.
    deltaserve_engine::load_kernels_eagerly_for(cli.command.tensor_parallel_size());
    let filter = EnvFilter::try_from_env("DELTASERVE_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    // A closed log stream (a pipe whose reader went away) must not take the server down:
    // tracing-subscriber reports a failed write with `eprintln!`, which panics when stderr is
    // the very thing that failed, so lost log lines are dropped silently instead.
    let sub = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).log_internal_errors(false);
    if cli.log_json {
        sub.json().init();
    } else {
        sub.init();
    }
    match cli.command {
        Command::Serve(a) => cli::serve::run(a),
        Command::Generate(a) => cli::generate::run(a),
        Command::Eval(a) => cli::eval::run(a),
        Command::Prune(a) => cli::prune::run(a),
        Command::InitRandom(a) => cli::init_random::run(a),
    }
}

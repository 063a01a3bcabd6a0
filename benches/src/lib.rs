//! Benchmark helpers shared by the bench binaries; the benchmarks themselves live in the bench
//! targets and `src/bin/`.

pub mod engine_metrics;
pub mod sse;

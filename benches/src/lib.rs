//! Benchmark helpers live in the bench targets.

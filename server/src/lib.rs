//! deltaserve's server library: the OpenAI-compatible HTTP API ([`app`]) over the engine
//! thread that batches requests ([`scheduler`]). The `deltaserve` binary adds the command line;
//! tests call [`app`] in process.

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod api;
pub mod listen;
pub mod metrics;
pub mod response;
pub mod routes;
pub mod scheduler;
pub mod stop;
pub mod structured;

pub use routes::{app, AppState, Serving};

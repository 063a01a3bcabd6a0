//! The OpenAI-compatible API surface: request/response types, validation and errors.

pub mod chat;
pub mod error;
pub mod structured;
pub mod types;
pub mod validate;

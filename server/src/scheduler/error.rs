//! What the engine thread can fail a request with. The HTTP layer maps it to the OpenAI
//! envelope (`api::error`); the scheduler knows nothing of HTTP.

/// A scheduler-side failure of one request.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SchedulerError {
    /// `--max-queue` requests already wait.
    #[error("the server is at capacity: {waiting} requests are waiting (limit {limit}); retry later")]
    QueueFull {
        /// Requests waiting.
        waiting: usize,
        /// `--max-queue`.
        limit: usize,
    },
    /// The engine thread has stopped.
    #[error("the engine thread has stopped")]
    Stopped,
    /// The server shut down before the request finished.
    #[error("the server shut down before the request finished")]
    ShutDown,
    /// The request ran past `--request-timeout` (seconds).
    #[error("request timed out after {0} s")]
    Timeout(u64),
    /// The engine refused an input (a token id past the vocabulary, say).
    #[error("`{field}` must be {expected}; got {actual}")]
    Invalid {
        /// The input.
        field: &'static str,
        /// What it must be.
        expected: String,
        /// What it was.
        actual: String,
    },
    /// An engine fault.
    #[error("{0}")]
    Engine(String),
}

impl From<deltaserve_engine::EngineError> for SchedulerError {
    fn from(e: deltaserve_engine::EngineError) -> Self {
        match e {
            deltaserve_engine::EngineError::Invalid { field, expected, actual } => Self::Invalid { field, expected, actual },
            other => Self::Engine(other.to_string()),
        }
    }
}

//! What the engine thread can fail a request with. The HTTP layer maps it to the OpenAI
//! envelope (`api::error`); the scheduler knows nothing of HTTP.

/// A scheduler-side failure of one request.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SchedulerError {
    /// Every slot is taken and `--max-queue` requests already wait.
    #[error("the server is at capacity: {in_flight} requests are running or waiting (limit: {slots} slots + {queue} queued); retry later")]
    QueueFull {
        /// Requests running or waiting.
        in_flight: usize,
        /// `--max-num-seqs`.
        slots: usize,
        /// `--max-queue`.
        queue: usize,
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

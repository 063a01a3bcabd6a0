//! The one error type of the HTTP layer and its mapping to status + OpenAI envelope.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

/// Everything a request can fail with.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ApiError {
    /// A malformed body or an impossible parameter (400).
    #[error("{message}")]
    InvalidRequest {
        /// What was wrong: field, expected, actual.
        message: String,
        /// The offending field, when known.
        param: Option<String>,
        /// A stable machine-readable code.
        code: &'static str,
    },
    /// Missing or wrong API key (401).
    #[error("invalid or missing API key")]
    Unauthorized,
    /// Unknown model or route (404).
    #[error("{0}")]
    NotFound(String),
    /// Wrong HTTP method for a route (405).
    #[error("method not allowed")]
    MethodNotAllowed,
    /// Body over the size limit (413).
    #[error("request body too large: limit is {limit} bytes")]
    PayloadTooLarge {
        /// The limit.
        limit: usize,
    },
    /// Every slot is taken and the waiting queue is full (429 with Retry-After).
    #[error("the server is at capacity: {in_flight} requests are running or waiting (limit: {slots} slots + {queue} queued); retry later")]
    QueueFull {
        /// Requests running or waiting.
        in_flight: usize,
        /// `--max-num-seqs`.
        slots: usize,
        /// `--max-queue`.
        queue: usize,
    },
    /// The request names a model this server does not serve (404, `model_not_found`).
    #[error("{0}")]
    ModelNotFound(String),
    /// The body is not declared as JSON (415).
    #[error("expected `Content-Type: application/json`")]
    UnsupportedMediaType,
    /// Not ready, or draining for shutdown (503).
    #[error("{0}")]
    Unavailable(String),
    /// The body did not arrive within `--body-read-timeout` seconds (408).
    #[error("the request body did not arrive within {0} s (`--body-read-timeout`)")]
    BodyTimeout(u64),
    /// The request ran past `--request-timeout` (504).
    #[error("request timed out after {0} s")]
    Timeout(u64),
    /// An engine fault (500).
    #[error("internal error: {0}")]
    Internal(String),
}

#[derive(Serialize)]
struct Envelope<'a> {
    error: Body<'a>,
}

#[derive(Serialize)]
struct Body<'a> {
    message: String,
    #[serde(rename = "type")]
    kind: &'a str,
    param: Option<&'a str>,
    code: Option<&'a str>,
}

impl ApiError {
    /// A 400 naming the field, what it must be, and what it was.
    pub fn invalid(param: &str, expected: impl std::fmt::Display, actual: impl std::fmt::Display) -> Self {
        Self::InvalidRequest {
            message: format!("`{param}` must be {expected}; got {actual}"),
            param: Some(param.into()),
            code: "invalid_value",
        }
    }

    /// A 400 with a free-form message.
    pub fn bad_request(message: impl Into<String>, param: Option<&str>, code: &'static str) -> Self {
        Self::InvalidRequest { message: message.into(), param: param.map(str::to_owned), code }
    }

    /// HTTP status.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::InvalidRequest { .. } => StatusCode::BAD_REQUEST,
            Self::Unauthorized => StatusCode::UNAUTHORIZED,
            Self::NotFound(_) | Self::ModelNotFound(_) => StatusCode::NOT_FOUND,
            Self::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Self::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::QueueFull { .. } => StatusCode::TOO_MANY_REQUESTS,
            Self::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::BodyTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            Self::Timeout(_) => StatusCode::GATEWAY_TIMEOUT,
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The stable `type` string of the envelope.
    pub fn error_type(&self) -> &'static str {
        match self {
            Self::InvalidRequest { .. } | Self::PayloadTooLarge { .. } | Self::MethodNotAllowed => "invalid_request_error",
            Self::Unauthorized => "authentication_error",
            Self::NotFound(_) | Self::ModelNotFound(_) => "not_found_error",
            Self::UnsupportedMediaType => "invalid_request_error",
            Self::QueueFull { .. } => "rate_limit_error",
            Self::Unavailable(_) => "unavailable_error",
            Self::Timeout(_) | Self::BodyTimeout(_) => "timeout_error",
            Self::Internal(_) => "server_error",
        }
    }

    fn param(&self) -> Option<&str> {
        match self {
            Self::InvalidRequest { param, .. } => param.as_deref(),
            Self::ModelNotFound(_) => Some("model"),
            _ => None,
        }
    }

    fn code(&self) -> Option<&'static str> {
        Some(match self {
            Self::InvalidRequest { code, .. } => code,
            Self::Unauthorized => "invalid_api_key",
            Self::NotFound(_) => "not_found",
            Self::ModelNotFound(_) => "model_not_found",
            Self::UnsupportedMediaType => "unsupported_media_type",
            Self::MethodNotAllowed => "method_not_allowed",
            Self::PayloadTooLarge { .. } => "payload_too_large",
            Self::QueueFull { .. } => "queue_full",
            Self::Unavailable(_) => "unavailable",
            Self::Timeout(_) => "timeout",
            Self::BodyTimeout(_) => "body_timeout",
            Self::Internal(_) => "internal_error",
        })
    }

    /// The envelope as JSON text (also used for SSE error events).
    pub fn to_json(&self) -> String {
        let env = Envelope { error: Body { message: self.to_string(), kind: self.error_type(), param: self.param(), code: self.code() } };
        serde_json::to_string(&env)
            .unwrap_or_else(|_| r#"{"error":{"message":"error","type":"server_error","param":null,"code":null}}"#.into())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut res =
            (self.status(), [(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))], self.to_json()).into_response();
        if matches!(self, Self::QueueFull { .. } | Self::Unavailable(_)) {
            res.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        if matches!(self, Self::Unauthorized) {
            res.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        // Lets the logging/metrics middleware count errors by code without re-parsing.
        res.extensions_mut().insert(ErrorLogged(self.to_string()));
        res
    }
}

/// Attached to error responses for the logging middleware.
#[derive(Debug, Clone)]
pub struct ErrorLogged(pub String);

impl From<deltaserve_engine::EngineError> for ApiError {
    fn from(e: deltaserve_engine::EngineError) -> Self {
        use deltaserve_engine::EngineError as E;
        match e {
            E::Invalid { field, expected, actual } => Self::invalid(field, expected, actual),
            E::Tokenizer(m) => Self::bad_request(format!("tokenizer: {m}"), None, "tokenizer_error"),
            other => Self::Internal(other.to_string()),
        }
    }
}

impl From<crate::scheduler::SchedulerError> for ApiError {
    fn from(e: crate::scheduler::SchedulerError) -> Self {
        use crate::scheduler::SchedulerError as S;
        match e {
            S::QueueFull { in_flight, slots, queue } => Self::QueueFull { in_flight, slots, queue },
            S::Stopped | S::ShutDown => Self::Unavailable(e.to_string()),
            S::Timeout(secs) => Self::Timeout(secs),
            S::Invalid { field, expected, actual } => Self::invalid(field, expected, actual),
            S::Engine(m) => Self::Internal(m),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelope_has_openai_shape() {
        let e = ApiError::invalid("top_p", "in (0, 1]", 2);
        let v: serde_json::Value = serde_json::from_str(&e.to_json()).unwrap();
        assert_eq!(v["error"]["message"], "`top_p` must be in (0, 1]; got 2");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(v["error"]["param"], "top_p");
        assert_eq!(v["error"]["code"], "invalid_value");
        assert_eq!(e.status(), StatusCode::BAD_REQUEST);
    }
}

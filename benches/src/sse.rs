//! Streaming OpenAI requests timed as a client sees them: time to first token, the gaps between
//! tokens, and the whole request.

use std::time::Instant;

use futures::StreamExt;

/// Timings of a set of streamed requests.
#[derive(Debug, Default)]
pub struct Sample {
    /// Time to first token per request, seconds.
    pub ttft: Vec<f64>,
    /// Gaps between consecutive tokens, seconds.
    pub itl: Vec<f64>,
    /// When each gap of `itl` ended (its second token arrived).
    pub itl_end: Vec<Instant>,
    /// Whole-request latency per successful request, seconds.
    pub e2e: Vec<f64>,
    /// Chunks with a token received.
    pub tokens: usize,
    /// Tokens generated as the server's final usage chunk counts them (with
    /// `stream_options.include_usage`): exact where a token's text is empty and sends no chunk.
    pub usage_tokens: usize,
    /// Failed requests.
    pub errors: usize,
}

impl Sample {
    /// Tokens generated: the server's usage count when it sent one, else the token chunks.
    pub fn generated(&self) -> usize {
        if self.usage_tokens > 0 {
            self.usage_tokens
        } else {
            self.tokens
        }
    }

    /// Adds `other`'s timings to these.
    pub fn merge(&mut self, other: Sample) {
        self.ttft.extend(other.ttft);
        self.itl.extend(other.itl);
        self.itl_end.extend(other.itl_end);
        self.e2e.extend(other.e2e);
        self.tokens += other.tokens;
        self.usage_tokens += other.usage_tokens;
        self.errors += other.errors;
    }
}

impl Sample {
    /// The gaps between tokens that ended at or after `from`.
    pub fn itl_since(&self, from: Instant) -> Vec<f64> {
        self.itl.iter().zip(&self.itl_end).filter(|(_, &end)| end >= from).map(|(&gap, _)| gap).collect()
    }
}

/// The `p`-quantile (nearest rank) of `v`; NaN when empty.
pub fn pct(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

/// Posts a streaming request, recording TTFT and ITL per SSE chunk; returns the text streamed
/// (`choices[0].text`, or `.delta.content` for chat), `None` on an error.
pub async fn stream_tokens(client: &reqwest::Client, url: &str, body: &serde_json::Value, s: &mut Sample) -> Option<String> {
    let t0 = Instant::now();
    let Ok(resp) = client.post(url).json(body).send().await else {
        s.errors += 1;
        return None;
    };
    if !resp.status().is_success() {
        s.errors += 1;
        return None;
    }
    let mut text = String::new();
    let mut stream = resp.bytes_stream();
    let mut last: Option<Instant> = None;
    let mut buf = String::new();
    while let Some(chunk) = stream.next().await {
        let Ok(chunk) = chunk else {
            s.errors += 1;
            return None;
        };
        buf.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = buf.find("\n\n") {
            let event: String = buf.drain(..end + 2).collect();
            let Some(data) = event.trim().strip_prefix("data: ") else { continue };
            if data == "[DONE]" {
                continue;
            }
            // One SSE chunk per generated token (with logprobs asked for, empty texts included);
            // a chat stream's first chunk carries only the role and is no token.
            let parsed = serde_json::from_str::<serde_json::Value>(data).ok();
            if let Some(n) = parsed.as_ref().and_then(|v| v["usage"]["completion_tokens"].as_u64()) {
                s.usage_tokens += n as usize;
            }
            let c = parsed.as_ref().map(|v| &v["choices"][0]);
            if c.is_some_and(|c| c["delta"].get("role").is_some()) {
                continue;
            }
            // The closing chunk (finish_reason, no text, no logprobs) and a usage chunk
            // (`choices: []`) are no tokens.
            let text_of = |c: &serde_json::Value| c["text"].as_str().or(c["delta"]["content"].as_str()).unwrap_or("").to_owned();
            if c.is_none_or(|c| c.is_null() || (!c["finish_reason"].is_null() && text_of(c).is_empty() && c["logprobs"].is_null())) {
                continue;
            }
            if let Some(c) = c {
                text.push_str(c["text"].as_str().or(c["delta"]["content"].as_str()).unwrap_or(""));
            }
            let now = Instant::now();
            match last {
                None => s.ttft.push(now.duration_since(t0).as_secs_f64()),
                Some(p) => {
                    s.itl.push(now.duration_since(p).as_secs_f64());
                    s.itl_end.push(now);
                }
            }
            last = Some(now);
            s.tokens += 1;
        }
    }
    s.e2e.push(t0.elapsed().as_secs_f64());
    Some(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_window_keeps_the_gaps_that_end_in_it() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let s = Sample { itl: vec![0.004, 0.009, 0.005, 0.006], itl_end: vec![at(10), at(1500), at(1499), at(2000)], ..Default::default() };
        assert_eq!(s.itl_since(at(1500)), vec![0.009, 0.006]);
        assert_eq!(s.itl_since(at(0)), s.itl);
        assert!(s.itl_since(at(3000)).is_empty());
    }
}

//! What the server's engine did during a benchmark run, from its Prometheus `/metrics` read
//! before and after: decode steps and their mean batch, prefill and mixed passes, prompt tokens.
//! A closed-loop run's output rate falls short of the bare decode step's by the batches it runs
//! below full (ramps and tails), the passes that prefill prompts and the host work between
//! steps; these counts separate the first two from the third.

use std::collections::HashMap;

use serde_json::json;

/// Series of one `/metrics` text: metric name (without the `model_name` label), plus a `phase`
/// label where there is one, to value.
#[derive(Debug, Default, Clone)]
pub struct Scrape(HashMap<String, f64>);

/// The series read, by their exposition names.
const STEPS: &str = "deltaserve:step_duration_seconds";
const BATCH: &str = "deltaserve:decode_batch_size";
const PROMPT: &str = "deltaserve:prompt_tokens_total";
const GENERATED: &str = "deltaserve:generation_tokens_total";

impl Scrape {
    /// Parses the exposition text: each sample line `name{labels} value`; of the labels only
    /// `phase` is kept (as `name/phase`).
    pub fn parse(text: &str) -> Self {
        let mut m = HashMap::new();
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let Some((series, value)) = line.rsplit_once(' ') else { continue };
            let Ok(value) = value.parse::<f64>() else { continue };
            let (name, labels) = series.split_once('{').unwrap_or((series, ""));
            let phase = labels.split(',').find_map(|kv| kv.trim_end_matches('}').strip_prefix("phase=")).map(|p| p.trim_matches('"'));
            let key = match phase {
                Some(p) => format!("{name}/{p}"),
                None => name.to_owned(),
            };
            m.insert(key, value);
        }
        Self(m)
    }

    /// Reads `{base}/metrics`; `None` when the server has none (another server, or an error).
    pub async fn read(client: &reqwest::Client, base: &str) -> Option<Self> {
        let resp = client.get(format!("{base}/metrics")).send().await.ok()?;
        if !resp.status().is_success() {
            return None;
        }
        Some(Self::parse(&resp.text().await.ok()?))
    }

    fn get(&self, key: &str) -> f64 {
        self.0.get(key).copied().unwrap_or(0.0)
    }

    /// The engine's work between `before` and this scrape, as JSON: per phase the steps and
    /// their seconds (a decode step's span runs from its launch to its tokens sent, so steps
    /// launched ahead overlap and the seconds can add up past the run's), the mean batch of
    /// decode rows over the decode steps and mixed passes (a mixed pass decodes too), and the
    /// prompt and generated tokens. `None` when this scrape lacks the
    /// engine's series.
    pub fn since(&self, before: &Scrape) -> Option<serde_json::Value> {
        let d = |k: &str| self.get(k) - before.get(k);
        if !self.0.contains_key(&format!("{BATCH}_count")) {
            return None;
        }
        let phase = |p: &str| {
            let (n, s) = (d(&format!("{STEPS}_count/{p}")), d(&format!("{STEPS}_sum/{p}")));
            json!({"steps": n, "seconds": s, "mean_ms": if n > 0.0 { s / n * 1e3 } else { f64::NAN }})
        };
        let steps = d(&format!("{BATCH}_count"));
        Some(json!({
            "decode": phase("decode"),
            "prefill": phase("prefill"),
            "mixed": phase("mixed"),
            "decode_rows": d(&format!("{BATCH}_sum")),
            "mean_decode_batch": if steps > 0.0 { d(&format!("{BATCH}_sum")) / steps } else { f64::NAN },
            "prompt_tokens": d(PROMPT),
            "generated_tokens": d(GENERATED),
        }))
    }
}

/// One line for the markdown output: the engine's steps of a run (`Scrape::since`'s JSON).
pub fn summary(e: &serde_json::Value) -> String {
    let f = |k: &str, q: &str| e[k][q].as_f64().unwrap_or(f64::NAN);
    format!(
        "engine, from /metrics: {:.0} decode steps ({:.2} ms mean, from launch to tokens sent), {:.0} prefill passes \
         ({:.1} ms mean), {:.0} mixed passes ({:.1} ms mean); {:.1} decode rows a step or mixed pass; {:.0} prompt tokens",
        f("decode", "steps"),
        f("decode", "mean_ms"),
        f("prefill", "steps"),
        f("prefill", "mean_ms"),
        f("mixed", "steps"),
        f("mixed", "mean_ms"),
        e["mean_decode_batch"].as_f64().unwrap_or(f64::NAN),
        e["prompt_tokens"].as_f64().unwrap_or(f64::NAN),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    // Exposition text as the prometheus crate writes it (the server's format).
    const BEFORE: &str = r#"# HELP deltaserve:decode_batch_size Sequences per batched decode step.
# TYPE deltaserve:decode_batch_size histogram
deltaserve:decode_batch_size_bucket{model_name="m",le="1"} 2
deltaserve:decode_batch_size_sum{model_name="m"} 10
deltaserve:decode_batch_size_count{model_name="m"} 4
deltaserve:step_duration_seconds_sum{model_name="m",phase="decode"} 0.5
deltaserve:step_duration_seconds_count{model_name="m",phase="decode"} 4
deltaserve:prompt_tokens_total{model_name="m"} 100
"#;
    const AFTER: &str = r#"deltaserve:decode_batch_size_sum{model_name="m"} 110
deltaserve:decode_batch_size_count{model_name="m"} 6
deltaserve:step_duration_seconds_sum{model_name="m",phase="decode"} 0.6
deltaserve:step_duration_seconds_count{model_name="m",phase="decode"} 6
deltaserve:step_duration_seconds_sum{phase="prefill",model_name="m"} 0.03
deltaserve:step_duration_seconds_count{phase="prefill",model_name="m"} 3
deltaserve:prompt_tokens_total{model_name="m"} 612
deltaserve:generation_tokens_total{model_name="m"} 100
"#;

    #[test]
    fn differences_of_two_scrapes() {
        let e = Scrape::parse(AFTER).since(&Scrape::parse(BEFORE)).expect("the engine's series are there");
        assert_eq!(e["decode"]["steps"], 2.0);
        assert!((e["decode"]["mean_ms"].as_f64().unwrap() - 50.0).abs() < 1e-9);
        assert_eq!(e["mean_decode_batch"], 50.0);
        assert_eq!(e["prefill"]["steps"], 3.0);
        assert!((e["prefill"]["mean_ms"].as_f64().unwrap() - 10.0).abs() < 1e-9);
        assert_eq!(e["mixed"]["steps"], 0.0);
        assert_eq!(e["prompt_tokens"], 512.0);
        assert_eq!(e["generated_tokens"], 100.0);
    }

    #[test]
    fn another_servers_metrics_give_nothing() {
        let other = Scrape::parse("vllm:num_requests_running{model_name=\"m\"} 3\n");
        assert!(other.since(&Scrape::default()).is_none());
    }
}

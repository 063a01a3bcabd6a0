//! Resolves `--model`: a local checkpoint directory or a Hugging Face repo id `org/name[@revision]`.

use std::path::{Path, PathBuf};

use hf_hub::{api::sync::ApiBuilder, Cache, Repo, RepoType};

use crate::error::{EngineError, Result};

/// Files fetched for a repo; absent optional ones are skipped.
const REQUIRED: &[&str] = &["config.json", "tokenizer.json"];
const OPTIONAL: &[&str] = &["tokenizer_config.json", "generation_config.json"];

/// Whether `HF_HUB_OFFLINE` asks for no network.
fn offline() -> bool {
    std::env::var("HF_HUB_OFFLINE").map(|v| matches!(v.trim(), "1" | "true" | "TRUE" | "True" | "yes" | "ON" | "on")).unwrap_or(false)
}

/// Splits `org/name@rev` into (`org/name`, `rev`), defaulting to `main`.
pub fn parse_repo_id(spec: &str) -> Option<(String, String)> {
    let (id, rev) = match spec.split_once('@') {
        Some((id, rev)) if !rev.is_empty() => (id, rev),
        Some(_) => return None,
        None => (spec, "main"),
    };
    let mut parts = id.split('/');
    let ok = matches!((parts.next(), parts.next(), parts.next()), (Some(a), Some(b), None) if !a.is_empty() && !b.is_empty());
    ok.then(|| (id.to_owned(), rev.to_owned()))
}

/// Returns a local directory holding the checkpoint named by `spec`.
pub fn resolve_model(spec: &str) -> Result<PathBuf> {
    let local = Path::new(spec);
    if local.is_dir() {
        return Ok(local.to_path_buf());
    }
    let Some((id, rev)) = parse_repo_id(spec) else {
        return Err(EngineError::Invalid {
            field: "model",
            expected: "an existing checkpoint directory or a Hugging Face repo id `org/name[@revision]`".into(),
            actual: spec.into(),
        });
    };
    let repo = Repo::with_revision(id, RepoType::Model, rev);
    let cache = Cache::from_env();
    if offline() {
        let cached = cache.repo(repo.clone());
        let config = cached.get("config.json").ok_or_else(|| EngineError::Offline { repo: spec.into(), cache: cache.path().clone() })?;
        return config
            .parent()
            .map(Path::to_path_buf)
            .ok_or_else(|| EngineError::Offline { repo: spec.into(), cache: cache.path().clone() });
    }
    let mut builder = ApiBuilder::from_env().with_progress(true);
    if let Ok(token) = std::env::var("HF_TOKEN") {
        builder = builder.with_token(Some(token));
    }
    let hub_err = |m: String| EngineError::Hub { repo: spec.into(), message: m };
    let api = builder.build().map_err(|e| hub_err(e.to_string()))?.repo(repo);
    let mut dir = None;
    for f in REQUIRED {
        let p = api.get(f).map_err(|e| hub_err(format!("{f}: {e}")))?;
        dir = p.parent().map(Path::to_path_buf);
    }
    for f in OPTIONAL {
        // Optional files: their absence is normal, so a failure is only logged.
        if let Err(e) = api.get(f) {
            tracing::debug!(file = f, error = %e, "optional file not fetched");
        }
    }
    match api.get(crate::weights::INDEX_FILE) {
        Ok(index) => {
            let text = std::fs::read_to_string(&index).map_err(|e| hub_err(e.to_string()))?;
            let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| hub_err(e.to_string()))?;
            let mut shards: Vec<String> =
                v["weight_map"].as_object().into_iter().flat_map(|m| m.values()).filter_map(|s| s.as_str().map(str::to_owned)).collect();
            shards.sort();
            shards.dedup();
            for s in shards {
                api.get(&s).map_err(|e| hub_err(format!("{s}: {e}")))?;
            }
        }
        Err(_) => {
            api.get(crate::weights::SINGLE_FILE).map_err(|e| hub_err(format!("{}: {e}", crate::weights::SINGLE_FILE)))?;
        }
    }
    dir.ok_or_else(|| hub_err("no files".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repo_ids_parse() {
        assert_eq!(parse_repo_id("org/name"), Some(("org/name".into(), "main".into())));
        assert_eq!(parse_repo_id("org/name@v1"), Some(("org/name".into(), "v1".into())));
        assert_eq!(parse_repo_id("name"), None);
        assert_eq!(parse_repo_id("a/b/c"), None);
        assert_eq!(parse_repo_id("org/name@"), None);
    }
}

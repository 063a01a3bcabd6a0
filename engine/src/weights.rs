//! Safetensors checkpoints: memory-mapped, single or sharded, with per-tensor shape checks.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use memmap2::Mmap;
use safetensors::{Dtype as StDtype, SafeTensors};

use crate::error::WeightError;

/// Name of a single-file checkpoint.
pub const SINGLE_FILE: &str = "model.safetensors";
/// Name of a sharded checkpoint's index.
pub const INDEX_FILE: &str = "model.safetensors.index.json";

struct Entry {
    file: usize,
    dtype: StDtype,
    shape: Vec<usize>,
    /// Byte range inside the file's mmap.
    range: (usize, usize),
}

/// All tensors of a checkpoint directory, memory-mapped.
pub struct Checkpoint {
    files: Vec<(PathBuf, Mmap)>,
    entries: HashMap<String, Entry>,
}

impl std::fmt::Debug for Checkpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checkpoint")
            .field("files", &self.files.iter().map(|(p, _)| p).collect::<Vec<_>>())
            .field("tensors", &self.entries.len())
            .finish()
    }
}

fn file_err(path: &Path, message: impl ToString) -> WeightError {
    WeightError::File { path: path.to_path_buf(), message: message.to_string() }
}

/// A truncated file, said in bytes: the size its header promises against the size it has.
fn check_length(path: &Path, bytes: &[u8]) -> Result<(), WeightError> {
    let truncated =
        |expected: usize| file_err(path, format!("truncated: expected {expected} bytes (from its header), the file has {}", bytes.len()));
    let Some(n) = bytes.get(..8).map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])) as usize) else {
        return Err(truncated(8));
    };
    let Some(header) = bytes.get(8..8usize.saturating_add(n)) else { return Err(truncated(8 + n)) };
    // The data's end is the largest end offset any tensor claims; a bad header is left to
    // `deserialize` to describe.
    let end = serde_json::from_slice::<serde_json::Value>(header)
        .ok()
        .and_then(|h| h.as_object()?.values().filter_map(|t| t.get("data_offsets")?.as_array()?.get(1)?.as_u64()).max().map(|e| e as usize))
        .unwrap_or(0);
    if bytes.len() < 8 + n + end {
        return Err(truncated(8 + n + end));
    }
    Ok(())
}

impl Checkpoint {
    /// Opens `model.safetensors`, or every shard named by `model.safetensors.index.json`.
    pub fn open(dir: &Path) -> Result<Self, WeightError> {
        let index = dir.join(INDEX_FILE);
        let paths: Vec<PathBuf> = if index.exists() {
            let text = std::fs::read_to_string(&index).map_err(|e| file_err(&index, e))?;
            let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| file_err(&index, e))?;
            let map = v.get("weight_map").and_then(|m| m.as_object()).ok_or_else(|| file_err(&index, "no `weight_map` object"))?;
            let mut shards: Vec<String> = map.values().filter_map(|f| f.as_str().map(str::to_owned)).collect();
            shards.sort();
            shards.dedup();
            shards.into_iter().map(|s| dir.join(s)).collect()
        } else {
            vec![dir.join(SINGLE_FILE)]
        };
        let mut files = Vec::with_capacity(paths.len());
        let mut entries = HashMap::new();
        for (i, path) in paths.into_iter().enumerate() {
            let file = std::fs::File::open(&path).map_err(|e| file_err(&path, e))?;
            // SAFETY: the file is opened read-only and checkpoints are not modified while served.
            let mmap = unsafe { Mmap::map(&file) }.map_err(|e| file_err(&path, e))?;
            check_length(&path, &mmap)?;
            // `deserialize` validates the header and that the data fits the file.
            SafeTensors::deserialize(&mmap).map_err(|e| file_err(&path, format!("{e:?}")))?;
            let (header_len, meta) = SafeTensors::read_metadata(&mmap).map_err(|e| file_err(&path, format!("{e:?}")))?;
            let base = 8 + header_len;
            for (name, info) in meta.tensors() {
                let (a, b) = info.data_offsets;
                entries.insert(name, Entry { file: i, dtype: info.dtype, shape: info.shape.clone(), range: (base + a, base + b) });
            }
            files.push((path, mmap));
        }
        Ok(Self { files, entries })
    }

    /// Whether a tensor exists.
    pub fn contains(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }

    /// On-disk shape of a tensor.
    pub fn shape(&self, name: &str) -> Option<&[usize]> {
        self.entries.get(name).map(|e| e.shape.as_slice())
    }

    /// On-disk dtype of a tensor (BF16, F16 or F32), if present and supported.
    pub fn dtype(&self, name: &str) -> Option<DType> {
        match self.entries.get(name)?.dtype {
            StDtype::BF16 => Some(DType::BF16),
            StDtype::F16 => Some(DType::F16),
            StDtype::F32 => Some(DType::F32),
            _ => None,
        }
    }

    /// All tensor names, sorted.
    pub fn names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.entries.keys().cloned().collect();
        v.sort();
        v
    }

    /// Loads a tensor as stored, converted to `dtype` on `device`, without shape checks.
    pub fn load_raw(&self, name: &str, dtype: DType, device: &Device) -> Result<Tensor, WeightError> {
        let e = self.entries.get(name).ok_or_else(|| WeightError::Missing { tensor: name.into(), expected: vec![] })?;
        let disk = match e.dtype {
            StDtype::BF16 => DType::BF16,
            StDtype::F16 => DType::F16,
            StDtype::F32 => DType::F32,
            other => return Err(WeightError::DType { tensor: name.into(), dtype: format!("{other:?}") }),
        };
        let bytes = &self.files[e.file].1[e.range.0..e.range.1];
        let t = Tensor::from_raw_buffer(bytes, disk, &e.shape, &Device::Cpu)
            .map_err(|err| file_err(&self.files[e.file].0, format!("tensor `{name}`: {err}")))?;
        let t = t
            .to_dtype(dtype)
            .and_then(|t| t.to_device(device))
            .map_err(|err| file_err(&self.files[e.file].0, format!("tensor `{name}`: {err}")))?;
        Ok(t)
    }
}

/// Typed access to a checkpoint's tensors under a key prefix, as candle's `VarBuilder` but with
/// this crate's errors: every `get` checks presence and the shape the config implies.
#[derive(Clone)]
pub struct Weights<'a> {
    ckpt: &'a Checkpoint,
    prefix: String,
    dtype: DType,
    device: Device,
    check_finite: bool,
}

impl<'a> Weights<'a> {
    /// Root accessor; tensors load as `dtype` on `device`.
    pub fn new(ckpt: &'a Checkpoint, dtype: DType, device: &Device, check_finite: bool) -> Self {
        Self { ckpt, prefix: String::new(), dtype, device: device.clone(), check_finite }
    }

    /// The device tensors load onto.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// A sub-path (`vb.pp("attn")`).
    pub fn pp(&self, name: impl std::fmt::Display) -> Self {
        let prefix = if self.prefix.is_empty() { name.to_string() } else { format!("{}.{name}", self.prefix) };
        Self { prefix, ..self.clone() }
    }

    /// The full key of `name` under this prefix.
    pub fn key(&self, name: &str) -> String {
        if self.prefix.is_empty() {
            name.to_owned()
        } else {
            format!("{}.{name}", self.prefix)
        }
    }

    /// Whether `name` exists under this prefix.
    pub fn contains(&self, name: &str) -> bool {
        self.ckpt.contains(&self.key(name))
    }

    /// On-disk shape of `name`, if present.
    pub fn shape(&self, name: &str) -> Option<Vec<usize>> {
        self.ckpt.shape(&self.key(name)).map(<[usize]>::to_vec)
    }

    /// Loads `name` in the compute dtype, checking its shape.
    pub fn get(&self, shape: &[usize], name: &str) -> Result<Tensor, WeightError> {
        self.get_as(shape, name, self.dtype)
    }

    /// Loads `name` in fp32 (gate parameters, norms computed in fp32), checking its shape.
    pub fn get_f32(&self, shape: &[usize], name: &str) -> Result<Tensor, WeightError> {
        self.get_as(shape, name, DType::F32)
    }

    fn get_as(&self, shape: &[usize], name: &str, dtype: DType) -> Result<Tensor, WeightError> {
        let key = self.key(name);
        match self.ckpt.shape(&key) {
            None => return Err(WeightError::Missing { tensor: key, expected: shape.to_vec() }),
            Some(s) if s != shape => return Err(WeightError::Shape { tensor: key, expected: shape.to_vec(), actual: s.to_vec() }),
            Some(_) => {}
        }
        let t = self.ckpt.load_raw(&key, dtype, &self.device)?;
        if self.check_finite {
            check_finite(&key, &t)?;
        }
        Ok(t)
    }
}

fn check_finite(key: &str, t: &Tensor) -> Result<(), WeightError> {
    let v = t
        .to_dtype(DType::F32)
        .and_then(|t| t.flatten_all())
        .and_then(|t| t.to_vec1::<f32>())
        .map_err(|e| WeightError::File { path: PathBuf::from(key), message: e.to_string() })?;
    let count = v.iter().filter(|x| !x.is_finite()).count();
    if count > 0 {
        return Err(WeightError::NonFinite { tensor: key.into(), count });
    }
    Ok(())
}

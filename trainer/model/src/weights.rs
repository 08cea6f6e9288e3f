//! Hugging Face folders: `config.json` plus `model.safetensors`, or shards
//! listed in `model.safetensors.index.json`. Any float dtype on disk (F32,
//! F16, BF16) is converted to the model's dtype on load; saves use the model's
//! dtype.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use tch::{Device, Kind, Tensor};

use super::weight_file::{WeightFile, write_tensors};
use super::{Model, ModelConfig, ModelError};

const SINGLE_FILE: &str = "model.safetensors";
const INDEX_FILE: &str = "model.safetensors.index.json";
/// Above this many bytes of parameters a save is sharded (transformers' old
/// default `max_shard_size`).
pub const DEFAULT_MAX_SHARD_BYTES: usize = 5 << 30;

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> ModelError + '_ {
    move |source| ModelError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The safetensors files of a folder: the index's shards, else the single file.
fn weight_files(dir: &Path) -> Result<Vec<PathBuf>, ModelError> {
    let index = dir.join(INDEX_FILE);
    if index.exists() {
        let text = fs::read_to_string(&index).map_err(io_err(&index))?;
        let json: Value = serde_json::from_str(&text)
            .map_err(|e| ModelError::Weights(format!("{INDEX_FILE}: {e}")))?;
        let map = json
            .get("weight_map")
            .and_then(Value::as_object)
            .ok_or_else(|| ModelError::Weights(format!("{INDEX_FILE} has no weight_map")))?;
        let files: BTreeMap<&str, ()> = map
            .values()
            .filter_map(Value::as_str)
            .map(|f| (f, ()))
            .collect();
        return Ok(files.keys().map(|f| dir.join(f)).collect());
    }
    let single = dir.join(SINGLE_FILE);
    if single.exists() {
        return Ok(vec![single]);
    }
    Err(ModelError::Weights(format!(
        "{} has neither {SINGLE_FILE} nor {INDEX_FILE}",
        dir.display()
    )))
}

/// Every tensor of a Hugging Face folder (single file or shards), on the CPU
/// in its stored dtype.
pub fn read_safetensors_folder(dir: &Path) -> Result<Vec<(String, Tensor)>, ModelError> {
    let mut all = Vec::new();
    for path in weight_files(dir)? {
        let file = WeightFile::open(&path)?;
        for entry in file.entries() {
            all.push((entry.name.clone(), file.read(entry)?));
        }
    }
    Ok(all)
}

/// Checkpoint entries that are not parameters here: transformers 4.3x
/// stored RoPE buffers; tied checkpoints may still carry `lm_head.weight`.
fn ignored(name: &str, config: &ModelConfig) -> bool {
    name.ends_with("rotary_emb.inv_freq")
        || (config.tie_word_embeddings && name == "lm_head.weight")
}

impl Model {
    /// Loads `config.json` and the weights of a Hugging Face folder as `kind`
    /// on `device`.
    pub fn load(dir: &Path, kind: Kind, device: Device) -> Result<Self, ModelError> {
        let path = dir.join("config.json");
        let config =
            ModelConfig::from_json_str(&fs::read_to_string(&path).map_err(io_err(&path))?)?;
        let model = Self::new(config, kind, device)?;
        model.load_weights_from_folder(dir)?;
        Ok(model)
    }

    /// Copies every parameter from a Hugging Face folder into this model's
    /// existing tensors; all parameters must be present. A file's tensors
    /// are read and copied one at a time (so a load holds the model plus one
    /// tensor), after its header has shown every name and shape to fit;
    /// the files of a sharded folder are copied one after another.
    pub fn load_weights_from_folder(&self, dir: &Path) -> Result<(), ModelError> {
        let vars = self.vs.variables();
        let mut missing: HashSet<&String> = vars.keys().collect();
        for path in weight_files(dir)? {
            let file = WeightFile::open(&path)?;
            let mut pairs = Vec::with_capacity(file.entries().len());
            for entry in file.entries() {
                missing.remove(&entry.name);
                if let Some(dst) = self.target(&vars, &entry.name, &entry.shape)? {
                    pairs.push((dst.shallow_clone(), entry));
                }
            }
            for (mut dst, entry) in pairs {
                let src = file.read(entry)?;
                tch::no_grad(|| dst.f_copy_(&src))?;
            }
        }
        if !missing.is_empty() {
            let mut missing: Vec<&str> = missing.into_iter().map(String::as_str).collect();
            missing.sort();
            return Err(ModelError::Weights(format!(
                "missing from {}: {}",
                dir.display(),
                missing.join(", ")
            )));
        }
        Ok(())
    }

    /// Copies `tensors` (Hugging Face names, any float dtype, any device) into
    /// the existing parameters without reallocating them, so views held
    /// elsewhere (an optimizer, an inference engine) see the new values. A
    /// subset is fine; an unknown name or a shape mismatch is an error and
    /// then nothing is copied.
    pub fn load_weights_in_place(&self, tensors: &[(String, Tensor)]) -> Result<(), ModelError> {
        let vars = self.vs.variables();
        let mut pairs = Vec::with_capacity(tensors.len());
        for (name, src) in tensors {
            if let Some(dst) = self.target(&vars, name, &src.size())? {
                pairs.push((dst.shallow_clone(), src));
            }
        }
        tch::no_grad(|| {
            for (mut dst, src) in pairs {
                dst.f_copy_(src)?;
            }
            Ok(())
        })
    }

    /// The parameter a checkpoint tensor `name` of `shape` loads into:
    /// `None` for an entry that is not a parameter here (see [`ignored`]),
    /// an error for an unknown name or another shape.
    fn target<'v>(
        &self,
        vars: &'v HashMap<String, Tensor>,
        name: &str,
        shape: &[i64],
    ) -> Result<Option<&'v Tensor>, ModelError> {
        if ignored(name, &self.config) {
            return Ok(None);
        }
        let dst = vars
            .get(name)
            .ok_or_else(|| ModelError::Weights(format!("unexpected tensor {name}")))?;
        if dst.size() != shape {
            return Err(ModelError::Weights(format!(
                "{name}: shape {shape:?}, expected {:?}",
                dst.size()
            )));
        }
        Ok(Some(dst))
    }

    /// Saves `config.json` and the weights (single file up to
    /// [`DEFAULT_MAX_SHARD_BYTES`], sharded above) into `dir`.
    pub fn save(&self, dir: &Path) -> Result<(), ModelError> {
        self.save_sharded(dir, DEFAULT_MAX_SHARD_BYTES)
    }

    /// Like [`Model::save`], sharding once the weights exceed `max_shard_bytes`:
    /// shards `model-0000i-of-0000n.safetensors` filled in parameter order
    /// plus `model.safetensors.index.json`, as transformers writes them.
    pub fn save_sharded(&self, dir: &Path, max_shard_bytes: usize) -> Result<(), ModelError> {
        crate::weights::create_private_dir_all(dir).map_err(io_err(dir))?;
        let config_path = dir.join("config.json");
        let config_text = serde_json::to_string_pretty(&self.config.raw)
            .map_err(|e| ModelError::Config(e.to_string()))?;
        fs::write(&config_path, config_text + "\n").map_err(io_err(&config_path))?;

        // With a LoRA adapter: the merged weights, a folder any engine serves.
        let mut params: Vec<(String, Tensor)> = match self.lora_config() {
            Some(_) => self.serving_weights(),
            None => self.vs.variables().into_iter().collect(),
        };
        params.sort_by_cached_key(|(name, _)| natural_key(name));
        let bytes = |t: &Tensor| t.numel() * t.kind().elt_size_in_bytes();
        let total: usize = params.iter().map(|(_, t)| bytes(t)).sum();
        let mut shards: Vec<Vec<(String, Tensor)>> = vec![vec![]];
        let mut shard_bytes = 0;
        for (name, t) in params {
            if shard_bytes > 0 && shard_bytes + bytes(&t) > max_shard_bytes {
                shards.push(vec![]);
                shard_bytes = 0;
            }
            shard_bytes += bytes(&t);
            if let Some(shard) = shards.last_mut() {
                shard.push((name, t));
            }
        }
        let (stale, keep) = if shards.len() == 1 {
            (INDEX_FILE, SINGLE_FILE)
        } else {
            (SINGLE_FILE, INDEX_FILE)
        };
        // Loaders prefer one layout over the other; never leave both.
        let stale = dir.join(stale);
        if stale.exists() {
            fs::remove_file(&stale).map_err(io_err(&stale))?;
        }
        if shards.len() == 1 {
            return write_tensors(&dir.join(keep), &shards[0]);
        }
        let n = shards.len();
        let mut weight_map = BTreeMap::new();
        for (i, shard) in shards.iter().enumerate() {
            let file = format!("model-{:05}-of-{n:05}.safetensors", i + 1);
            write_tensors(&dir.join(&file), shard)?;
            for (name, _) in shard {
                weight_map.insert(name.clone(), file.clone());
            }
        }
        let index = json!({ "metadata": { "total_size": total }, "weight_map": weight_map });
        let index_path = dir.join(keep);
        fs::write(&index_path, format!("{index:#}\n")).map_err(io_err(&index_path))
    }
}

/// Orders `model.layers.10` after `model.layers.9`.
fn natural_key(name: &str) -> Vec<(u64, String)> {
    name.split('.')
        .map(|part| match part.parse::<u64>() {
            Ok(n) => (n, String::new()),
            Err(_) => (u64::MAX, part.to_string()),
        })
        .collect()
}

/// Creates `dir` and its missing parents readable by the owner only
/// (0700): a saved model or checkpoint holds the policy's
/// weights.
pub fn create_private_dir_all(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

//! A model's LoRA adapter (see `lora.rs`): attach, the parameters that
//! train, the weights as served (merged), and PEFT's folder in and out.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tch::Tensor;
use tch::nn::{Init, VarStore};

use super::lora::{self, LoraConfig, LoraPair};
use super::{Model, ModelError};

/// The adapter's parameters (their own store, so the base folder's save
/// and load never see them) and its config.
#[derive(Debug)]
pub struct Adapter {
    config: LoraConfig,
    vs: VarStore,
    /// Dropout on while the trainer's forward runs with gradients.
    training: Arc<AtomicBool>,
    /// Set while the base alone answers (see [`Model::without_adapter`]).
    off: Arc<AtomicBool>,
}

impl Model {
    /// Attaches a fresh LoRA adapter to the target linears and freezes
    /// every base parameter: from now on only the adapter trains.
    pub fn add_lora(&mut self, config: &LoraConfig) -> Result<(), ModelError> {
        config.check().map_err(ModelError::Config)?;
        if self.adapter.is_some() {
            return Err(ModelError::Config(
                "the model has a LoRA adapter already".into(),
            ));
        }
        self.vs.freeze();
        let mut vs = VarStore::new(self.device());
        vs.set_kind(self.kind);
        let root = vs.root();
        let training = Arc::new(AtomicBool::new(false));
        let off = Arc::new(AtomicBool::new(false));
        let r = config.rank;
        for (i, layer) in self.layers.iter_mut().enumerate() {
            for (module, linear) in layer.linears_mut() {
                let name = module.rsplit('.').next().unwrap_or_default();
                if !config.target_modules.iter().any(|t| t == name) {
                    continue;
                }
                let (out, inp) = linear.dims();
                let mut path = &root / "model" / "layers" / i;
                for part in module.split('.') {
                    path = &path / part;
                }
                // PEFT: kaiming_uniform_(a=sqrt(5)) on A is uniform within
                // 1/sqrt(in); B starts at zero, so the adapter starts as
                // the identity.
                let bound = 1.0 / (inp as f64).sqrt();
                let a = (&path / "lora_A").var(
                    "weight",
                    &[r, inp],
                    Init::Uniform {
                        lo: -bound,
                        up: bound,
                    },
                );
                let b = (&path / "lora_B").var("weight", &[out, r], Init::Const(0.0));
                linear.attach(LoraPair::new(a, b, config, (training.clone(), off.clone())));
            }
        }
        self.adapter = Some(Adapter {
            config: config.clone(),
            vs,
            training,
            off,
        });
        Ok(())
    }

    pub fn lora_config(&self) -> Option<&LoraConfig> {
        self.adapter.as_ref().map(|a| &a.config)
    }

    /// Runs `f` with the adapter left out: the frozen base answers (the KL
    /// reference of a LoRA run, at no extra weight memory). Without an
    /// adapter, `f` runs on the model as it is.
    pub fn without_adapter<T>(&self, f: impl FnOnce(&Model) -> T) -> T {
        let Some(a) = &self.adapter else {
            return f(self);
        };
        a.off.store(true, Ordering::Relaxed);
        // Back on even when `f` panics.
        struct On<'a>(&'a AtomicBool);
        impl Drop for On<'_> {
            fn drop(&mut self) {
                self.0.store(false, Ordering::Relaxed);
            }
        }
        let _on = On(&a.off);
        f(self)
    }

    /// Dropout on the adapter's input: on for the trainer's forward with
    /// gradients, off otherwise.
    pub fn set_lora_training(&self, on: bool) {
        if let Some(a) = &self.adapter {
            a.training.store(on, Ordering::Relaxed);
        }
    }

    /// The parameters an optimizer updates, by name, sorted: the adapter's
    /// (PEFT names) with LoRA, else every base parameter that requires
    /// gradients.
    pub fn trainable_parameters(&self) -> Vec<(String, Tensor)> {
        let mut params: Vec<(String, Tensor)> = match &self.adapter {
            Some(a) => {
                a.vs.variables()
                    .into_iter()
                    // PeftModel.base_model (LoraModel).model (the causal LM).
                    .map(|(name, t)| (format!("base_model.model.{name}"), t))
                    .collect()
            }
            None => self
                .vs
                .variables()
                .into_iter()
                .filter(|(_, t)| t.requires_grad())
                .collect(),
        };
        params.sort_by(|a, b| a.0.cmp(&b.0));
        params
    }

    /// Copies of the weights as an engine serves them, under Hugging Face
    /// names: each adapted linear merged (`W + scale * B A`).
    pub fn serving_weights(&self) -> Vec<(String, Tensor)> {
        tch::no_grad(|| {
            let mut merged: HashMap<String, Tensor> = HashMap::new();
            for (i, layer) in self.layers.iter().enumerate() {
                for (module, linear) in layer.linears() {
                    if let Some(w) = linear.serving_weight() {
                        merged.insert(format!("model.layers.{i}.{module}.weight"), w);
                    }
                }
            }
            self.vs
                .variables()
                .into_iter()
                .map(|(name, t)| {
                    let w = merged.remove(&name).unwrap_or_else(|| t.copy());
                    (name, w)
                })
                .collect()
        })
    }

    /// Writes the adapter as PEFT does (`adapter_config.json`,
    /// `adapter_model.safetensors`); `base` names the base model.
    pub fn save_adapter(&self, dir: &Path, base: &str) -> Result<(), ModelError> {
        let adapter = self
            .adapter
            .as_ref()
            .ok_or_else(|| ModelError::Config("the model has no LoRA adapter".into()))?;
        lora::save_adapter(dir, &adapter.config, base, &self.trainable_parameters())
    }

    /// Copies a PEFT adapter folder into the attached adapter (same rank,
    /// alpha and targets); checked whole before anything is copied.
    pub fn load_adapter(&self, dir: &Path) -> Result<(), ModelError> {
        self.prepare_adapter(dir)?.apply()
    }

    /// Reads and checks a PEFT adapter folder against the attached adapter;
    /// [`AdapterLoad::apply`] copies it in.
    pub fn prepare_adapter(&self, dir: &Path) -> Result<AdapterLoad, ModelError> {
        let adapter = self
            .adapter
            .as_ref()
            .ok_or_else(|| ModelError::Config("the model has no LoRA adapter".into()))?;
        let (config, tensors) = lora::read_adapter(dir)?;
        let ours = &adapter.config;
        let mut targets = config.target_modules.clone();
        let mut expected = ours.target_modules.clone();
        targets.sort();
        expected.sort();
        if config.rank != ours.rank || config.alpha != ours.alpha || targets != expected {
            return Err(ModelError::Weights(format!(
                "{}: adapter r={} alpha={} targets {:?} does not fit this one (r={} alpha={} targets {:?})",
                dir.display(),
                config.rank,
                config.alpha,
                targets,
                ours.rank,
                ours.alpha,
                expected
            )));
        }
        let params = self.trainable_parameters();
        let mut pairs = Vec::with_capacity(params.len());
        for (name, dst) in &params {
            let src = tensors
                .get(name)
                .ok_or_else(|| ModelError::Weights(format!("{}: missing {name}", dir.display())))?;
            if src.size() != dst.size() {
                return Err(ModelError::Weights(format!(
                    "{name}: shape {:?}, expected {:?}",
                    src.size(),
                    dst.size()
                )));
            }
            pairs.push((dst.shallow_clone(), src.shallow_clone()));
        }
        if tensors.len() != params.len() {
            let extra: Vec<&String> = tensors
                .keys()
                .filter(|k| !params.iter().any(|(n, _)| n == *k))
                .collect();
            return Err(ModelError::Weights(format!(
                "{}: tensors this adapter does not have: {extra:?}",
                dir.display()
            )));
        }
        Ok(AdapterLoad { pairs })
    }
}

/// A checked adapter folder, ready to copy in.
pub struct AdapterLoad {
    pairs: Vec<(Tensor, Tensor)>,
}

impl AdapterLoad {
    pub fn apply(self) -> Result<(), ModelError> {
        tch::no_grad(|| {
            for (mut dst, src) in self.pairs {
                dst.f_copy_(&src)?;
            }
            Ok(())
        })
    }
}

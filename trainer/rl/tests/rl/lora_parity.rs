//! LoRA against PEFT 0.21.2 (pinned by deploy/setup.sh): the Python script
//! builds a tiny random Llama with an adapter on every projection
//! (`tests/parity/peft_reference.py`); agl loads the base, attaches LoRA and
//! loads PEFT's adapter folder, and must give PEFT's logits and the same
//! adapter gradients of a fixed loss; the adapter agl saves loads back into
//! PEFT with the same logits; the merged weights agl serves give the same
//! logits without an adapter.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use crate::common::venv_python;
use agl_model::{Model, read_adapter};
use tch::{Device, Kind, Tensor};

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/parity/peft_reference.py")
}

/// Runs the Python script once per test binary.
fn reference_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("peft_parity");
        let _ = std::fs::remove_dir_all(&out);
        let status = Command::new(venv_python())
            .arg(script())
            .arg(&out)
            .status()
            .unwrap();
        assert!(status.success(), "peft_reference.py failed: {status}");
        out
    })
}

fn tensor(file: &Path, name: &str) -> Tensor {
    Tensor::read_safetensors(file)
        .unwrap()
        .into_iter()
        .find(|(n, _)| n == name)
        .unwrap_or_else(|| panic!("{name} not in {}", file.display()))
        .1
}

/// The base with PEFT's adapter attached and loaded.
fn adapted(dir: &Path) -> Model {
    let (config, _) = read_adapter(&dir.join("adapter")).unwrap();
    let mut model = Model::load(&dir.join("base"), Kind::Float, Device::Cpu).unwrap();
    model.add_lora(&config).unwrap();
    model.load_adapter(&dir.join("adapter")).unwrap();
    model
}

fn max_diff(a: &Tensor, b: &Tensor, mask: &Tensor) -> f64 {
    let keep = mask.to_kind(Kind::Bool).unsqueeze(-1);
    let d = (a - b).abs().masked_fill(&keep.logical_not(), 0.0);
    f64::try_from(d.max()).unwrap()
}

#[test]
fn logits_and_adapter_gradients_match_peft() {
    let dir = reference_dir();
    let reference = dir.join("reference.safetensors");
    let (tokens, mask) = (
        tensor(&reference, "tokens"),
        tensor(&reference, "attention_mask"),
    );
    let model = adapted(dir);
    let logits = model.forward(&tokens, Some(&mask)).unwrap();
    let diff = max_diff(&logits.detach(), &tensor(&reference, "logits"), &mask);
    assert!(diff < 1e-4, "logits differ from PEFT's by {diff}");

    (&logits * tensor(&reference, "loss_weights"))
        .sum(Kind::Float)
        .backward();
    let params = model.trainable_parameters();
    assert_eq!(
        params.len(),
        2 * 7 * 2,
        "A and B of 7 projections in 2 layers"
    );
    for (name, p) in &params {
        let theirs = tensor(&reference, &format!("grad.{name}"));
        let d = f64::try_from((p.grad() - &theirs).abs().max()).unwrap();
        let scale = f64::try_from(theirs.abs().max()).unwrap().max(1.0);
        assert!(
            d / scale < 1e-4,
            "{name}: gradient differs by {d} (scale {scale})"
        );
    }
    // The base is frozen: no gradient reached it.
    for (name, t) in model.var_store().variables() {
        assert!(!t.requires_grad(), "{name} requires grad");
        assert!(!t.grad().defined(), "{name} has a gradient");
    }
}

#[test]
fn the_adapter_agl_saves_loads_into_peft_and_merging_serves_the_same_logits() {
    let dir = reference_dir();
    let reference = dir.join("reference.safetensors");
    let (tokens, mask) = (
        tensor(&reference, "tokens"),
        tensor(&reference, "attention_mask"),
    );
    let model = adapted(dir);
    let ours = tch::no_grad(|| model.forward(&tokens, Some(&mask)).unwrap());

    let saved = tempfile::tempdir().unwrap();
    model.save_adapter(saved.path(), "base").unwrap();
    let out = saved.path().join("peft_logits.safetensors");
    let status = Command::new(venv_python())
        .arg(script())
        .arg("--load")
        .arg(dir.join("base"))
        .arg(saved.path())
        .arg(&reference)
        .arg(&out)
        .status()
        .unwrap();
    assert!(status.success(), "PEFT could not load agl's adapter");
    let diff = max_diff(&ours, &tensor(&out, "logits"), &mask);
    assert!(diff < 1e-4, "PEFT on agl's adapter differs by {diff}");

    // Merged into the base weights (what the engine serves), no adapter.
    let plain = Model::load(&dir.join("base"), Kind::Float, Device::Cpu).unwrap();
    plain
        .load_weights_in_place(&model.serving_weights())
        .unwrap();
    let merged = tch::no_grad(|| plain.forward(&tokens, Some(&mask)).unwrap());
    let diff = max_diff(&ours, &merged, &mask);
    assert!(diff < 1e-4, "merged weights differ by {diff}");
    // And a folder saved from the adapted model is the merged one.
    let folder = tempfile::tempdir().unwrap();
    model.save(folder.path()).unwrap();
    let reloaded = Model::load(folder.path(), Kind::Float, Device::Cpu).unwrap();
    let again = tch::no_grad(|| reloaded.forward(&tokens, Some(&mask)).unwrap());
    assert!(max_diff(&ours, &again, &mask) < 1e-4);
}

#[test]
fn an_adapter_of_another_shape_is_refused_before_anything_is_copied() {
    let dir = reference_dir();
    let (mut config, _) = read_adapter(&dir.join("adapter")).unwrap();
    config.rank = 8;
    let mut model = Model::load(&dir.join("base"), Kind::Float, Device::Cpu).unwrap();
    model.add_lora(&config).unwrap();
    let before: Vec<Tensor> = model
        .trainable_parameters()
        .into_iter()
        .map(|(_, t)| t.copy())
        .collect();
    let err = model
        .load_adapter(&dir.join("adapter"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("r=4") && err.contains("r=8"), "{err}");
    for ((_, t), b) in model.trainable_parameters().iter().zip(&before) {
        assert!(t.equal(b));
    }
}

/// Only the adapter gets AdamW state: with rank 8 on every projection of
/// the tiny model that is a small fraction of the full model's.
#[test]
fn only_the_adapter_gets_optimizer_state() {
    use agl_model::LoraConfig;
    use agl_rl::{AdamWConfig, LrDecay, LrSchedule, RlOptimizer};
    let schedule = LrSchedule {
        peak_lr: 1e-3,
        warmup_steps: 0,
        decay: LrDecay::Constant,
    };
    let config = crate::common::tiny_config(serde_json::json!({}));
    let mut model = crate::common::random_model(config, Kind::Float, 3);
    let full = RlOptimizer::new(&model, AdamWConfig::default(), schedule).unwrap();
    model.add_lora(&LoraConfig::default()).unwrap();
    let lora = RlOptimizer::new(&model, AdamWConfig::default(), schedule).unwrap();
    let numel = |opt: &RlOptimizer| -> i64 {
        opt.state_tensors()
            .iter()
            .filter(|(n, _)| n.starts_with("exp_avg."))
            .map(|(_, t)| t.numel() as i64)
            .sum()
    };
    let names: Vec<String> = lora.state_tensors().into_iter().map(|(n, _)| n).collect();
    assert!(
        names
            .iter()
            .filter(|n| *n != "rl.steps")
            .all(|n| n.contains(".lora_")),
        "{names:?}"
    );
    assert!(
        numel(&lora) * 5 < numel(&full),
        "{} vs {}",
        numel(&lora),
        numel(&full)
    );
}

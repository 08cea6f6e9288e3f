//! Parity with Hugging Face transformers: the Python script builds tiny
//! random models, saves them with `save_pretrained` and records their logits;
//! we load the same folders and compare.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use crate::common::venv_python;
use agl_model::{Model, read_safetensors_folder};
use tch::{Device, Kind, Tensor};

const CASES: [&str; 6] = [
    "llama_gqa_tied",
    "llama3_rope",
    "llama_linear_rope",
    "qwen2_bias",
    "qwen3_qk_norm",
    "mistral_window",
];

/// Runs the Python script once per test binary; its folders live under
/// cargo's per-target scratch dir and are rebuilt on every run.
fn hf_models() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("hf_parity");
        let _ = std::fs::remove_dir_all(&out);
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/parity/hf_reference.py");
        let status = Command::new(venv_python())
            .arg(&script)
            .arg(&out)
            .status()
            .unwrap();
        assert!(status.success(), "{} failed: {status}", script.display());
        out
    })
}

struct Reference {
    tokens: Tensor,
    mask: Tensor,
    logits: Tensor,
}

fn reference(dir: &Path, case: &str) -> Reference {
    let file = dir.join(format!("{case}.reference.safetensors"));
    let tensors = Tensor::read_safetensors(&file).unwrap();
    let get = |name: &str| {
        tensors
            .iter()
            .find(|(n, _)| n == name)
            .unwrap()
            .1
            .shallow_clone()
    };
    Reference {
        tokens: get("tokens"),
        mask: get("attention_mask"),
        logits: get("logits"),
    }
}

/// Largest difference over real (unpadded) positions.
fn masked_diff(ours: &Tensor, theirs: &Tensor, mask: &Tensor) -> f64 {
    let keep = mask.to_kind(Kind::Bool).unsqueeze(-1);
    let d = (ours.to_kind(Kind::Float) - theirs)
        .abs()
        .masked_fill(&keep.logical_not(), 0.0);
    f64::try_from(d.max()).unwrap()
}

#[test]
fn logits_match_transformers() {
    let out = hf_models();

    for case in CASES {
        let r = reference(out, case);
        let model = Model::load(&out.join(case), Kind::Float, Device::Cpu).unwrap();
        let ours = tch::no_grad(|| model.forward(&r.tokens, Some(&r.mask)).unwrap());
        let diff = masked_diff(&ours, &r.logits, &r.mask);
        let scale = f64::try_from(r.logits.abs().max()).unwrap();
        println!(
            "{case}: f32 max abs logit diff vs transformers {diff:e} (logits up to {scale:.2})"
        );
        assert!(diff < 1e-4, "{case}: {diff}");
        // Sanity: the parameters really differ between cases and matter.
        assert!(scale > 0.5, "{case}: logits suspiciously flat ({scale})");
    }
}

#[test]
fn bf16_load_of_transformers_weights_is_close() {
    let out = hf_models();
    for case in ["llama_gqa_tied", "qwen2_bias"] {
        let r = reference(out, case);
        let dir = out.join(case);
        assert!(
            read_safetensors_folder(&dir)
                .unwrap()
                .iter()
                .all(|(_, t)| t.kind() == Kind::Float)
        );
        let model = Model::load(&dir, Kind::BFloat16, Device::Cpu).unwrap();
        let ours = tch::no_grad(|| model.forward(&r.tokens, Some(&r.mask)).unwrap());
        assert_eq!(ours.kind(), Kind::BFloat16);
        let diff = masked_diff(&ours, &r.logits, &r.mask);
        println!("{case}: bf16 max abs logit diff vs transformers f32 {diff:.4}");
        assert!(diff < 0.1, "{case}: {diff}");
        // Same argmax almost everywhere.
        let agree = ours
            .to_kind(Kind::Float)
            .argmax(-1, false)
            .eq_tensor(&r.logits.argmax(-1, false));
        let agree = f64::try_from(
            agree
                .logical_and(&r.mask.to_kind(Kind::Bool))
                .sum(Kind::Float),
        )
        .unwrap();
        let total = f64::try_from(r.mask.sum(Kind::Float)).unwrap();
        assert!(
            agree / total > 0.9,
            "{case}: argmax agrees on {agree}/{total}"
        );
    }
}

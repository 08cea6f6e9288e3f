//! Saving and loading Hugging Face folders.

use crate::common::{max_abs_diff, random_model, random_tokens, tiny_config};
use agl_model::{Model, read_safetensors_folder};
use serde_json::json;
use tch::{Device, Kind, Tensor};

fn logits(model: &Model, tokens: &Tensor) -> Tensor {
    tch::no_grad(|| model.forward(tokens, None).unwrap())
}

#[test]
fn single_file_save_reloads_bitwise() {
    for tied in [false, true] {
        let model = random_model(
            tiny_config(json!({ "tie_word_embeddings": tied })),
            Kind::Float,
            1,
        );
        let dir = tempfile::tempdir().unwrap();
        model.save(dir.path()).unwrap();
        assert!(dir.path().join("model.safetensors").exists());
        assert!(!dir.path().join("model.safetensors.index.json").exists());
        let names: Vec<String> = read_safetensors_folder(dir.path())
            .unwrap()
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        assert_eq!(
            names.contains(&"lm_head.weight".to_string()),
            !tied,
            "tied models store no lm_head"
        );

        let reloaded = Model::load(dir.path(), Kind::Float, Device::Cpu).unwrap();
        let tokens = random_tokens(2, 10, 300);
        assert!(
            logits(&model, &tokens).equal(&logits(&reloaded, &tokens)),
            "tied={tied}"
        );
    }
}

#[test]
fn sharded_save_reloads_bitwise() {
    let model = random_model(tiny_config(json!({})), Kind::Float, 2);
    let dir = tempfile::tempdir().unwrap();
    // A single file first: the sharded save must replace it, not sit beside it.
    model.save(dir.path()).unwrap();
    model.save_sharded(dir.path(), 100_000).unwrap();
    assert!(!dir.path().join("model.safetensors").exists());
    let index: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("model.safetensors.index.json")).unwrap(),
    )
    .unwrap();
    let files: std::collections::BTreeSet<&str> = index["weight_map"]
        .as_object()
        .unwrap()
        .values()
        .map(|f| f.as_str().unwrap())
        .collect();
    assert!(files.len() > 1, "expected several shards, got {files:?}");
    let params: usize = model
        .var_store()
        .variables()
        .values()
        .map(|t| t.numel() * 4)
        .sum();
    assert_eq!(index["metadata"]["total_size"], json!(params));

    let reloaded = Model::load(dir.path(), Kind::Float, Device::Cpu).unwrap();
    let tokens = random_tokens(2, 10, 300);
    assert!(logits(&model, &tokens).equal(&logits(&reloaded, &tokens)));
}

#[test]
fn load_weights_in_place_keeps_the_tensors() {
    let a = random_model(tiny_config(json!({})), Kind::Float, 3);
    let b = random_model(tiny_config(json!({})), Kind::Float, 4);
    let tokens = random_tokens(1, 6, 300);
    let embed_before = a.var_store().variables()["model.embed_tokens.weight"].shallow_clone();
    let update: Vec<(String, Tensor)> = b.var_store().variables().into_iter().collect();
    a.load_weights_in_place(&update).unwrap();
    assert!(logits(&a, &tokens).equal(&logits(&b, &tokens)));
    // The old handle sees the new values: no reallocation.
    assert!(embed_before.equal(&b.var_store().variables()["model.embed_tokens.weight"]));

    let wrong = vec![(
        "model.norm.weight".to_string(),
        Tensor::ones([3], (Kind::Float, Device::Cpu)),
    )];
    assert!(
        a.load_weights_in_place(&wrong)
            .unwrap_err()
            .to_string()
            .contains("shape")
    );
    let unknown = vec![(
        "model.nope.weight".to_string(),
        Tensor::ones([3], (Kind::Float, Device::Cpu)),
    )];
    assert!(
        a.load_weights_in_place(&unknown)
            .unwrap_err()
            .to_string()
            .contains("unexpected")
    );
}

#[test]
fn missing_weights_are_an_error() {
    let model = random_model(tiny_config(json!({})), Kind::Float, 5);
    let dir = tempfile::tempdir().unwrap();
    model.save(dir.path()).unwrap();
    let mut tensors = read_safetensors_folder(dir.path()).unwrap();
    tensors.retain(|(name, _)| name != "model.norm.weight");
    let named: Vec<(&str, &Tensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
    Tensor::write_safetensors(&named, dir.path().join("model.safetensors")).unwrap();
    let err = Model::load(dir.path(), Kind::Float, Device::Cpu)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("missing") && err.contains("model.norm.weight"),
        "{err}"
    );
}

#[test]
fn bf16_save_and_load_convert_dtypes() {
    let model = random_model(tiny_config(json!({})), Kind::Float, 6);
    let tokens = random_tokens(2, 8, 300);
    let f32_dir = tempfile::tempdir().unwrap();
    model.save(f32_dir.path()).unwrap();

    // F32 on disk -> bf16 model.
    let bf16 = Model::load(f32_dir.path(), Kind::BFloat16, Device::Cpu).unwrap();
    assert_eq!(
        bf16.var_store().variables()["model.norm.weight"].kind(),
        Kind::BFloat16
    );
    let diff = max_abs_diff(&logits(&model, &tokens), &logits(&bf16, &tokens));
    println!("bf16 vs f32 max abs logit diff: {diff:.4}");
    assert!(diff < 0.1, "bf16 logits too far from f32: {diff}");

    // bf16 on disk -> f32 model: exactly the bf16 values.
    let bf16_dir = tempfile::tempdir().unwrap();
    bf16.save(bf16_dir.path()).unwrap();
    let stored = read_safetensors_folder(bf16_dir.path()).unwrap();
    assert!(stored.iter().all(|(_, t)| t.kind() == Kind::BFloat16));
    let back = Model::load(bf16_dir.path(), Kind::Float, Device::Cpu).unwrap();
    let w = |m: &Model| {
        m.var_store().variables()["model.layers.1.mlp.up_proj.weight"].to_kind(Kind::Float)
    };
    assert!(w(&back).equal(&w(&bf16)));
}

#[test]
fn bad_forward_inputs_are_errors() {
    let model = crate::common::random_model(
        crate::common::tiny_config(serde_json::json!({})),
        tch::Kind::Float,
        11,
    );
    use tch::Tensor;
    assert!(
        model
            .forward(&Tensor::from_slice(&[1i64, 500]).view([1, 2]), None)
            .is_err()
    );
    let mask = Tensor::from_slice(&[0i64, 1]).view([1, 2]);
    let err = model
        .forward(&Tensor::from_slice(&[1i64, 2]).view([1, 2]), Some(&mask))
        .unwrap_err();
    assert!(err.to_string().contains("right"), "{err}");
}

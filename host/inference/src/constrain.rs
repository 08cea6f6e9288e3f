//! Constrained decoding with llguidance over the policy's tokenizer: the
//! request's `response_format` (`json_object`, `json_schema`), vLLM's
//! `structured_outputs` (`json`, `json_object`, `regex`, `choice`,
//! `grammar` in Lark: the gateway sends a forced tool call's grammar, as
//! the model family writes calls, there) becomes a grammar whose token mask
//! the engine samples under (`agl_engine::TokenConstraint`).

use std::sync::{Arc, OnceLock};

use agl_conversation::compact_schema;
use agl_engine::TokenConstraint;
use agl_tokenizer::Tokenizer;
use agl_wire::ApiError;
use llguidance::api::TopLevelGrammar;
use llguidance::earley::SlicedBiasComputer;
use llguidance::toktrie::{InferenceCapabilities, TokEnv, TokRxInfo, TokTrie, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use serde_json::{Value, json};

/// The parser factory over the policy's vocabulary, built on first use
/// (the token trie takes a moment for a large vocabulary).
pub struct Grammars {
    tokenizer: Arc<Tokenizer>,
    eos: Vec<u32>,
    factory: OnceLock<Result<ParserFactory, String>>,
}

impl Grammars {
    pub fn new(tokenizer: Arc<Tokenizer>, eos: Vec<u32>) -> Self {
        Grammars {
            tokenizer,
            eos,
            factory: OnceLock::new(),
        }
    }

    fn factory(&self) -> Result<&ParserFactory, ApiError> {
        self.factory
            .get_or_init(|| build_factory(&self.tokenizer, &self.eos))
            .as_ref()
            .map_err(|e| ApiError::internal(format!("constrained decoding is unavailable: {e}")))
    }

    /// The constraint `body` asks for, if any; a bad schema or grammar is
    /// a 400 naming the field.
    pub fn constraint(&self, body: &Value) -> Result<Option<Box<dyn TokenConstraint>>, ApiError> {
        Ok(self.constraints(body, 1)?.pop().flatten())
    }

    /// One constraint per choice of an `n`-choice request: the grammar is
    /// compiled once and its matcher copied (`None`s when it asks for none).
    pub fn constraints(
        &self,
        body: &Value,
        n: usize,
    ) -> Result<Vec<Option<Box<dyn TokenConstraint>>>, ApiError> {
        let Some((field, grammar)) = grammar_of(body)? else {
            return Ok((0..n).map(|_| None).collect());
        };
        let parser = self
            .factory()?
            .create_parser(grammar)
            .map_err(|e| ApiError::bad_request(format!("`{field}`: {e}")))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(ApiError::bad_request(format!("`{field}`: {e}")));
        }
        Ok((0..n)
            .map(|_| Some(Box::new(Guided(matcher.deep_clone())) as Box<dyn TokenConstraint>))
            .collect())
    }
}

fn build_factory(tokenizer: &Arc<Tokenizer>, eos: &[u32]) -> Result<ParserFactory, String> {
    let json: Value = serde_json::from_str(&tokenizer.to_json().map_err(|e| e.to_string())?)
        .map_err(|e| e.to_string())?;
    // Byte-level and byte-fallback vocabularies as llguidance reads them;
    // any other (e.g. a plain BPE over characters) token by token.
    let mut words = match llguidance::token_bytes_from_tokenizer_json(&json) {
        Ok(words) => words,
        Err(_) => decoded_tokens(tokenizer, &json),
    };
    let vocab = (tokenizer.vocab_size() as usize).max(words.len());
    words.resize(vocab, Vec::new());
    let first_eos = eos
        .first()
        .copied()
        .ok_or("the model has no end-of-turn token")?;
    let trie = TokTrie::from(&TokRxInfo::new(vocab as u32, first_eos), &words).with_eos_tokens(eos);
    let env: TokEnv = Arc::new(Env {
        trie,
        tokenizer: tokenizer.clone(),
    });
    let mut factory = ParserFactory::new(
        &env,
        InferenceCapabilities::default(),
        &SlicedBiasComputer::general_slices(),
    )
    .map_err(|e| e.to_string())?;
    factory.quiet();
    Ok(factory)
}

/// Each token's bytes as the tokenizer decodes it alone; special added
/// tokens marked as llguidance marks them (never matched by grammar text).
fn decoded_tokens(tokenizer: &Tokenizer, json: &Value) -> Vec<Vec<u8>> {
    let special: std::collections::HashMap<u64, &str> = json["added_tokens"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|t| t["special"] == json!(true))
        .filter_map(|t| Some((t["id"].as_u64()?, t["content"].as_str()?)))
        .collect();
    (0..tokenizer.vocab_size())
        .map(|id| match special.get(&u64::from(id)) {
            Some(content) => [&[TokTrie::SPECIAL_TOKEN_MARKER][..], content.as_bytes()].concat(),
            None => tokenizer
                .decode(&[id], false)
                .unwrap_or_default()
                .into_bytes(),
        })
        .collect()
}

/// llguidance's view of the tokenizer: the token trie, and tokenizing the
/// grammar's literal text with the policy's own tokenizer.
struct Env {
    trie: TokTrie,
    tokenizer: Arc<Tokenizer>,
}

impl TokenizerEnv for Env {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<u32> {
        self.tokenizer
            .encode(&String::from_utf8_lossy(s), false)
            .unwrap_or_default()
    }
}

/// One sequence's grammar state.
struct Guided(Matcher);

impl TokenConstraint for Guided {
    fn allowed(&mut self) -> Result<Vec<u32>, String> {
        let mask = self.0.compute_mask_or_eos().map_err(|e| e.to_string())?;
        Ok(mask.as_slice().to_vec())
    }

    fn commit(&mut self, token: u32) -> Result<bool, String> {
        self.0.consume_token(token).map_err(|e| e.to_string())?;
        Ok(self.0.is_stopped())
    }
}

fn json_grammar(schema: Value) -> TopLevelGrammar {
    TopLevelGrammar::from_json_schema(compact_schema(schema))
}

/// Which field of `body` constrains the output, and its grammar.
fn grammar_of(body: &Value) -> Result<Option<(&'static str, TopLevelGrammar)>, ApiError> {
    if let Some(format) = body.get("response_format").filter(|f| !f.is_null()) {
        let kind = format.get("type").and_then(Value::as_str).unwrap_or("");
        return match kind {
            "text" => Ok(None),
            "json_object" => Ok(Some((
                "response_format",
                json_grammar(json!({"type": "object"})),
            ))),
            "json_schema" => {
                let schema = format
                    .pointer("/json_schema/schema")
                    .filter(|s| s.is_object() || s.is_boolean())
                    .ok_or_else(|| {
                        ApiError::bad_request(
                            "`response_format.json_schema.schema` must be a JSON schema",
                        )
                    })?;
                Ok(Some(("response_format", json_grammar(schema.clone()))))
            }
            other => Err(ApiError::bad_request(format!(
                "`response_format.type` must be text, json_object or json_schema, got {other:?}"
            ))),
        };
    }
    if let Some(outputs) = body.get("structured_outputs").filter(|f| !f.is_null()) {
        return structured_outputs(outputs).map(|g| Some(("structured_outputs", g)));
    }
    Ok(None)
}

/// vLLM's `structured_outputs`: one of `json`, `json_object`, `regex`,
/// `choice`, `grammar`.
fn structured_outputs(v: &Value) -> Result<TopLevelGrammar, ApiError> {
    let bad = |m: &str| ApiError::bad_request(format!("`structured_outputs`: {m}"));
    if let Some(schema) = v.get("json").filter(|s| !s.is_null()) {
        let schema = match schema {
            Value::String(text) => serde_json::from_str(text).map_err(|e| bad(&e.to_string()))?,
            other => other.clone(),
        };
        return Ok(json_grammar(schema));
    }
    if v.get("json_object") == Some(&json!(true)) {
        return Ok(json_grammar(json!({"type": "object"})));
    }
    if let Some(rx) = v.get("regex").and_then(Value::as_str) {
        return Ok(TopLevelGrammar::from_regex(rx));
    }
    if let Some(choices) = v.get("choice").and_then(Value::as_array) {
        let alternatives: Option<Vec<String>> = choices
            .iter()
            .map(|c| {
                c.as_str()
                    .map(|s| serde_json::to_string(s).unwrap_or_default())
            })
            .collect();
        let alternatives = alternatives
            .filter(|a| !a.is_empty())
            .ok_or_else(|| bad("`choice` must be strings"))?;
        return Ok(TopLevelGrammar::from_lark(format!(
            "start: {}",
            alternatives.join(" | ")
        )));
    }
    if let Some(lark) = v.get("grammar").and_then(Value::as_str) {
        return Ok(TopLevelGrammar::from_lark(lark.to_string()));
    }
    Err(bad("give one of json, json_object, regex, choice, grammar"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use agl_conversation::{Family, ToolChoice, ToolFormat};

    /// What the gateway sends for a call of `cat` forced in a family whose
    /// calls are `tools`: the call's start in the prompt, the rest's
    /// grammar as `structured_outputs`.
    struct Forced {
        grammars: Grammars,
        start: String,
        body: Value,
    }

    fn grammars(tools: ToolFormat) -> Forced {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../examples/fixtures/tokenizer/tokenizer.json");
        let tokenizer = Arc::new(Tokenizer::from_file(&path).unwrap());
        let eos = tokenizer.encode("<|im_end|>", false).unwrap();
        let family = Family {
            tools,
            reasoning: false,
        };
        let choice = ToolChoice::Function("cat".into());
        let lark = family
            .forced_grammar(&choice, Some(&cat_tools()))
            .expect("a JSON-call family");
        Forced {
            grammars: Grammars::new(tokenizer, eos),
            start: family.forced_call(&choice),
            body: json!({"structured_outputs": {"grammar": lark}}),
        }
    }

    /// Whether the constraint lets the whole call `text` (its tokens
    /// after the start in the prompt, one by one) through.
    fn accepts(f: &Forced, text: &str) -> bool {
        let g = &f.grammars;
        let rest = text
            .strip_prefix(f.start.as_str())
            .expect("the call's start");
        let mut c = g.constraint(&f.body).unwrap().expect("constrained");
        for id in g.tokenizer.encode(rest, false).unwrap() {
            let mask = c.allowed().unwrap();
            if mask
                .get(id as usize / 32)
                .is_none_or(|w| w >> (id % 32) & 1 == 0)
            {
                return false;
            }
            c.commit(id).unwrap();
        }
        true
    }

    fn cat_tools() -> Value {
        json!([{"type": "function", "function": {"name": "cat", "parameters": {
                   "type": "object", "required": ["path"],
                   "properties": {"path": {"type": "string"}, "n": {"type": "integer"}}}}}])
    }

    #[test]
    fn forced_call_grammars_take_valid_calls_in_each_family_format_and_refuse_others() {
        let coder = grammars(ToolFormat::Qwen3Coder);
        let call = |params: &str| {
            format!("<tool_call>\n<function=cat>\n{params}</function>\n</tool_call>")
        };
        let path = "<parameter=path>\na < b.txt\n</parameter>\n";
        assert!(accepts(&coder, &call(path)));
        assert!(accepts(
            &coder,
            &call(&format!("{path}<parameter=n>\n3\n</parameter>\n"))
        ));
        assert!(
            !accepts(&coder, &call("<parameter=n>\n3\n</parameter>\n")),
            "path is required"
        );
        assert!(!accepts(
            &coder,
            &call(&format!("{path}<parameter=n>\nx\n</parameter>\n"))
        ));

        let hermes = grammars(ToolFormat::Hermes);
        let call = "<tool_call>\n{\"name\": \"cat\", \"arguments\": {\"path\": \"a.txt\", \"n\": 3}}\n</tool_call>";
        assert!(accepts(&hermes, call));
        assert!(!accepts(&hermes, &call.replace("3", "\"3\"")));
        let llama = grammars(ToolFormat::Llama3Json);
        assert!(accepts(
            &llama,
            "{\"name\": \"cat\", \"parameters\": {\"path\": \"a\"}}"
        ));
    }
}

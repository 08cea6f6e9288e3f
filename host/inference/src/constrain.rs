//! Constrained decoding with llguidance over the policy's tokenizer: the
//! request's `response_format` (`json_object`, `json_schema`), vLLM's
//! `structured_outputs` (`json`, `json_object`, `regex`, `choice`,
//! `grammar` in Lark), or a forced tool call (`tool_choice` `required` or a
//! named function, written as the model family writes calls)
//! becomes a grammar whose token mask the engine samples under
//! (`agl_engine::TokenConstraint`).

use std::sync::{Arc, OnceLock};

use agl_conversation::{Family, ToolChoice, compact_schema};
use agl_engine::TokenConstraint;
use agl_tokenizer::Tokenizer;
use agl_wire::ApiError;
use llguidance::api::TopLevelGrammar;
use llguidance::earley::SlicedBiasComputer;
use llguidance::toktrie::{InferenceCapabilities, TokEnv, TokRxInfo, TokTrie, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use serde_json::{Value, json};

use super::Api;

/// The parser factory over the policy's vocabulary, built on first use
/// (the token trie takes a moment for a large vocabulary).
pub struct Grammars {
    tokenizer: Arc<Tokenizer>,
    eos: Vec<u32>,
    /// How the model writes tool calls (a forced call's grammar).
    family: Family,
    factory: OnceLock<Result<ParserFactory, String>>,
}

impl Grammars {
    pub fn new(tokenizer: Arc<Tokenizer>, eos: Vec<u32>, family: Family) -> Self {
        Grammars {
            tokenizer,
            eos,
            family,
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
    pub fn constraint(
        &self,
        body: &Value,
        api: Api,
    ) -> Result<Option<Box<dyn TokenConstraint>>, ApiError> {
        Ok(self.constraints(body, api, 1)?.pop().flatten())
    }

    /// One constraint per choice of an `n`-choice request: the grammar is
    /// compiled once and its matcher copied (`None`s when it asks for none).
    pub fn constraints(
        &self,
        body: &Value,
        api: Api,
        n: usize,
    ) -> Result<Vec<Option<Box<dyn TokenConstraint>>>, ApiError> {
        let Some((field, grammar)) = grammar_of(body, api, self.family)? else {
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
fn grammar_of(
    body: &Value,
    api: Api,
    family: Family,
) -> Result<Option<(&'static str, TopLevelGrammar)>, ApiError> {
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
    if api == Api::Chat {
        return forced_tool_call(body, family);
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

/// `tool_choice` `required` (any offered tool) or a named function: a call
/// of that tool with arguments valid against its parameters' schema, as
/// the model family writes calls (`Family::call_grammar`).
fn forced_tool_call(
    body: &Value,
    family: Family,
) -> Result<Option<(&'static str, TopLevelGrammar)>, ApiError> {
    let choice = match body.get("tool_choice") {
        Some(Value::String(s)) if s == "required" => ToolChoice::Required,
        Some(choice @ Value::Object(_)) => ToolChoice::Function(
            choice
                .pointer("/function/name")
                .and_then(Value::as_str)
                .ok_or_else(|| ApiError::bad_request("`tool_choice.function.name` is missing"))?
                .to_string(),
        ),
        _ => return Ok(None),
    };
    let tools = body.get("tools").filter(|t| !t.is_null());
    let names: Vec<&str> = tools
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|t| t.pointer("/function/name").and_then(Value::as_str))
        .collect();
    match &choice {
        ToolChoice::Function(name) if !names.contains(&name.as_str()) => {
            return Err(ApiError::bad_request(format!(
                "`tool_choice` names `{name}`, which is not in `tools`"
            )));
        }
        ToolChoice::Required if names.is_empty() => {
            return Err(ApiError::bad_request(
                "`tool_choice` is `required` but `tools` offers none",
            ));
        }
        _ => {}
    }
    let lark = family.call_grammar(&choice, tools).ok_or_else(|| {
        ApiError::bad_request(
            "`tool_choice`: this model's tool-call format cannot be constrained (JSON calls only)",
        )
    })?;
    Ok(Some(("tool_choice", TopLevelGrammar::from_lark(lark))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use agl_conversation::ToolFormat;

    fn grammars(tools: ToolFormat) -> Grammars {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../examples/fixtures/tokenizer/tokenizer.json");
        let tokenizer = Arc::new(Tokenizer::from_file(&path).unwrap());
        let eos = tokenizer.encode("<|im_end|>", false).unwrap();
        Grammars::new(
            tokenizer,
            eos,
            Family {
                tools,
                reasoning: false,
            },
        )
    }

    /// Whether the constraint lets `text` (its tokens, one by one) through.
    fn accepts(g: &Grammars, body: &Value, text: &str) -> bool {
        let mut c = g.constraint(body, Api::Chat).unwrap().expect("constrained");
        for id in g.tokenizer.encode(text, false).unwrap() {
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

    fn cat_call() -> Value {
        json!({"tool_choice": {"type": "function", "function": {"name": "cat"}},
               "tools": [{"type": "function", "function": {"name": "cat", "parameters": {
                   "type": "object", "required": ["path"],
                   "properties": {"path": {"type": "string"}, "n": {"type": "integer"}}}}}]})
    }

    #[test]
    fn forced_calls_take_valid_calls_in_each_family_format_and_refuse_others() {
        let coder = grammars(ToolFormat::Qwen3Coder);
        let call = |params: &str| {
            format!("<tool_call>\n<function=cat>\n{params}</function>\n</tool_call>")
        };
        let path = "<parameter=path>\na < b.txt\n</parameter>\n";
        assert!(accepts(&coder, &cat_call(), &call(path)));
        assert!(accepts(
            &coder,
            &cat_call(),
            &call(&format!("{path}<parameter=n>\n3\n</parameter>\n"))
        ));
        assert!(
            !accepts(
                &coder,
                &cat_call(),
                &call("<parameter=n>\n3\n</parameter>\n")
            ),
            "path is required"
        );
        assert!(!accepts(
            &coder,
            &cat_call(),
            &call(&format!("{path}<parameter=n>\nx\n</parameter>\n"))
        ));

        let hermes = grammars(ToolFormat::Hermes);
        let call = "<tool_call>\n{\"name\": \"cat\", \"arguments\": {\"path\": \"a.txt\", \"n\": 3}}\n</tool_call>";
        assert!(accepts(&hermes, &cat_call(), call));
        assert!(!accepts(&hermes, &cat_call(), &call.replace("3", "\"3\"")));
        let llama = grammars(ToolFormat::Llama3Json);
        assert!(accepts(
            &llama,
            &cat_call(),
            "{\"name\": \"cat\", \"parameters\": {\"path\": \"a\"}}"
        ));
    }
}

//! Why a mini-swe-agent call did not continue its chain.
//!
//! The wit break kinds are few (`retokenize`, `template`, `summary`,
//! `sub-agent`, `other`), so the harness-specific cause is the first word of
//! the break's `detail`:
//!
//! | detail starts with | kind | when |
//! |---|---|---|
//! | `format-error-drop:` | `other` | the request is the previous request plus a user message carrying mini's format-error text: mini raised `FormatError` and never added the reply to its history |
//! | `reply-dropped:` | `other` | the same, but the user message carries no known format-error text (a custom `format_error_template`: add a marker to `extra_format_error_markers`) |
//! | `retry:` | `other` | the same conversation was sent again (a client or mini retry whose first answer was discarded) |
//! | `agent-switch:` | `sub-agent` | the `x-agl-agent` tag changed (only with `chain_by_agent = false`) |
//! | `summary:` / `sub-agent:` | same | the generic history classes of [`agl_plugin::breaks`] |
//! | `history-rewrite:` | `other` | any other edit of the history: a truncation, a changed turn |
//! | `template:` / `retokenize:` | same | the generic token-level classes of [`agl_plugin::breaks`] |
//!
//! The rest of the detail says what was seen and where the token ids first
//! differ.

use agl_plugin::breaks::Divergence;
use agl_plugin::call::content_text;
use agl_plugin::classify_break;
use agl_plugin::messages::same_message;
use agl_plugin::{BreakKind, ChainBreak, ModelCall, agent, request_messages};
use serde_json::Value;

/// Texts found in every format-error message mini-swe-agent 2.4.6 renders
/// with its shipped configs, and in its raw error texts (models whose
/// `format_error_template` is the default `{{ error }}`).
pub const FORMAT_ERROR_MARKERS: [&str; 9] = [
    // mini.yaml, swebench.yaml, programbench.yaml (tool calling)
    "Tool call error:",
    // default.yaml, mini_textbased.yaml, swebench_backticks/xml.yaml (text)
    "Format error:",
    // every shipped template, finish_reason `length` (truncated reply)
    "Your previous response reached the output token limit",
    // raw errors of the tool-call parsers (litellm, openrouter, portkey, ...)
    "No tool calls found in the response.",
    "Error parsing tool call arguments:",
    "Missing 'command' argument in bash tool call.",
    "Unknown tool '",
    // raw error and default template of the text-based models
    "Expected exactly 1 action, found",
    "Please always provide EXACTLY ONE action",
];

/// The format-error markers in force: the built-in ones plus the config's.
pub struct Markers {
    markers: Vec<String>,
}

impl Markers {
    pub fn new(extra: &[String]) -> Self {
        let builtin = FORMAT_ERROR_MARKERS.iter().map(|m| (*m).to_owned());
        Markers {
            markers: builtin.chain(extra.iter().cloned()).collect(),
        }
    }

    /// The first marker `text` contains.
    fn find(&self, text: &str) -> Option<&str> {
        self.markers
            .iter()
            .find(|m| text.contains(m.as_str()))
            .map(String::as_str)
    }
}

/// Classifies why `next`'s prompt does not continue the chain that `prev`
/// ended (see the module docs).
pub fn classify(prev: &ModelCall, next: &ModelCall, markers: &Markers) -> ChainBreak {
    if let Some((label, why)) = harness_break(prev, next, markers) {
        let kind = if label == "agent-switch" {
            BreakKind::SubAgent
        } else {
            BreakKind::Other
        };
        return ChainBreak {
            kind,
            call_index: next.index,
            detail: format!("{label}: {why}; {}", Divergence::locate(prev, next)),
        };
    }
    let generic = classify_break(prev, next);
    let label = match generic.kind {
        BreakKind::Retokenize => "retokenize",
        BreakKind::Template => "template",
        BreakKind::Summary => "summary",
        BreakKind::SubAgent => "sub-agent",
        BreakKind::Other => "history-rewrite",
    };
    ChainBreak {
        detail: format!("{label}: {}", generic.detail),
        ..generic
    }
}

/// A break that mini-swe-agent's own behaviour explains, as (label, why).
fn harness_break(
    prev: &ModelCall,
    next: &ModelCall,
    markers: &Markers,
) -> Option<(&'static str, String)> {
    let (prev_agent, next_agent) = (agent(prev), agent(next));
    if prev_agent != next_agent {
        return Some((
            "agent-switch",
            format!("agent {prev_agent:?} then {next_agent:?}"),
        ));
    }
    let prev_messages = request_messages(prev)?;
    let next_messages = request_messages(next)?;
    let kept = prev_messages.len();
    let keeps_history = next_messages.len() >= kept
        && prev_messages
            .iter()
            .zip(&next_messages)
            .all(|(a, b)| same_message(a, b));
    if !keeps_history {
        return None;
    }
    let Some(after) = next_messages.get(kept) else {
        return Some((
            "retry",
            "the same conversation was sent again; the earlier reply was discarded".to_owned(),
        ));
    };
    match role(after) {
        // The reply was echoed (perhaps re-rendered; a Responses output item
        // has no role): whether it continues is a token-level question.
        None | Some("assistant") => None,
        Some("user") => {
            let text = after.get("content").and_then(content_text);
            let found = text.as_deref().and_then(|t| markers.find(t));
            Some(match found {
                Some(marker) => (
                    "format-error-drop",
                    format!(
                        "message {kept} is a format-error message (matched {marker:?}) \
                         where the reply would be; the harness dropped the reply"
                    ),
                ),
                None => (
                    "reply-dropped",
                    format!(
                        "message {kept} is a user message without a known format-error text \
                         where the reply would be"
                    ),
                ),
            })
        }
        Some(other) => Some((
            "reply-dropped",
            format!("message {kept} (role {other}) is where the reply would be"),
        )),
    }
}

fn role(message: &Value) -> Option<&str> {
    message.get("role").and_then(Value::as_str)
}

//! Why a call's prompt did not continue its chain.
//!
//! 1. History. If the next request's conversation does not start with the
//!    previous request's plus the reply it got (compared as in
//!    [`crate::messages`]), the harness edited its history:
//!    - `sub-agent` when it is another conversation: a different system
//!      prompt, tool list or `x-agl-agent` tag;
//!    - `summary` when it keeps its start but replaces turns of the
//!      previous history with new text;
//!    - `other` for the rest (turns dropped, the reply edited).
//!
//!    For the completions API the same check runs on the prompt text;
//!    there, text that does extend while the ids differ can only be
//!    re-tokenisation: `retokenize`.
//! 2. Tokens, with the tokenizer (a [`Decoder`]): if the next prompt decodes to text
//!    that starts with the previous prompt + response text, only the ids
//!    differ: `retokenize`. Else, if the next prompt still starts with the
//!    previous prompt ids, the previous assistant turn was rendered
//!    differently (reasoning stripped, tool calls re-serialised):
//!    `template`. Else `other`.
//! 3. Tokens, without a tokenizer: ids first differing inside (the
//!    re-rendering of) the previous response mean `template`; before it,
//!    `other`. Telling `retokenize` from `template` needs the text, so
//!    without a tokenizer chat calls never classify as `retokenize`.

use crate::call::{self, Api, Call, Decoder};
use crate::prefix::common_prefix_len;
use crate::{BreakKind, ChainBreak, messages};

/// A `summary` break when `next`'s history holds a message with one of a
/// harness's compaction `markers` (the text it opens a summary with) that
/// `prev`'s did not: the harness replaced its history with a summary.
/// `None` otherwise, for the caller's other rules.
pub fn marked_summary<C: Call>(prev: &C, next: &C, markers: &[&str]) -> Option<ChainBreak> {
    if markers.is_empty() {
        return None;
    }
    let texts = |c: &C| -> Vec<String> {
        call::request_messages(c)
            .unwrap_or_default()
            .iter()
            .filter_map(|m| call::content_text(m.get("content")?))
            .collect()
    };
    let marked = |texts: &[String]| {
        markers
            .iter()
            .find(|m| texts.iter().any(|t| t.contains(*m)))
            .copied()
    };
    let found = marked(&texts(next))?;
    if marked(&texts(prev)).is_some() {
        return None;
    }
    let short: String = found.chars().take(60).collect();
    Some(ChainBreak {
        kind: BreakKind::Summary,
        call_index: next.index(),
        detail: format!(
            "summary: the history was compacted (\"{short}...\"); {}",
            Divergence::locate(prev, next)
        ),
    })
}

/// Classifies why `next`'s prompt does not start with `prev`'s prompt +
/// response (`prev` being the last call of the chain); `decoder` is the
/// policy's tokenizer, where the caller has one.
pub fn classify_break<C: Call>(prev: &C, next: &C, decoder: Option<&dyn Decoder>) -> ChainBreak {
    let at = Divergence::locate(prev, next);
    let (kind, why) = match history(prev, next) {
        History::Edited(kind, why) => (kind, format!("history edited: {why}")),
        History::TextExtends => (
            BreakKind::Retokenize,
            "the prompt text continues".to_owned(),
        ),
        History::Extends | History::Unknown => {
            let same_text = retokenized(prev, next, decoder);
            let note = match &same_text {
                Ok(_) => String::new(),
                Err(why) => format!(" ({why})"),
            };
            match same_text {
                Ok(true) => (
                    BreakKind::Retokenize,
                    "the decoded text continues".to_owned(),
                ),
                // The next prompt keeps the previous prompt's ids.
                _ if at.in_previous_response() => (
                    BreakKind::Template,
                    format!("the previous turn was rendered differently{note}"),
                ),
                _ => (
                    BreakKind::Other,
                    format!("the earlier prompt changed{note}"),
                ),
            }
        }
    };
    ChainBreak {
        kind,
        call_index: next.index(),
        detail: format!("{why}; {at}"),
    }
}

enum History {
    /// The conversation continues message by message.
    Extends,
    /// The completions prompt text continues exactly.
    TextExtends,
    Edited(BreakKind, String),
    /// Not comparable: no messages, or an API whose reply is not echoed.
    Unknown,
}

fn history(prev: &impl Call, next: &impl Call) -> History {
    if prev.api() == Api::Completions && next.api() == Api::Completions {
        return completion_history(prev, next);
    }
    let (Some(prev_messages), Some(next_messages)) =
        (call::request_messages(prev), call::request_messages(next))
    else {
        return History::Unknown;
    };
    let Some(reply) = call::assistant_message(prev) else {
        // A reply not echoed as one message (Responses output items): only
        // another agent can be told from the requests.
        return if other_agent(prev, next, &prev_messages, &next_messages) {
            History::Edited(
                BreakKind::SubAgent,
                "another system prompt, agent tag or tool list".to_owned(),
            )
        } else {
            History::Unknown
        };
    };
    match messages::messages_extend(&prev_messages, &reply, &next_messages) {
        Ok(()) => History::Extends,
        Err(why) => History::Edited(
            edit_kind(prev, next, &prev_messages, &reply, &next_messages),
            why,
        ),
    }
}

/// What kind of edit turned `prev`'s history (+ `reply`) into `next`'s.
fn edit_kind(
    prev: &impl Call,
    next: &impl Call,
    prev_messages: &[serde_json::Value],
    reply: &serde_json::Value,
    next_messages: &[serde_json::Value],
) -> BreakKind {
    let earlier: Vec<&serde_json::Value> = prev_messages.iter().chain([reply]).collect();
    let kept = earlier
        .iter()
        .zip(next_messages)
        .take_while(|(a, b)| messages::same_message(a, b))
        .count();
    if other_agent(prev, next, prev_messages, next_messages) {
        return BreakKind::SubAgent;
    }
    let seen = |m: &serde_json::Value| earlier.iter().any(|e| messages::same_message(e, m));
    let dropped = earlier[kept..].iter().any(|e| {
        !next_messages[kept..]
            .iter()
            .any(|m| messages::same_message(e, m))
    });
    let added = next_messages[kept..].iter().any(|m| !seen(m));
    // The reply itself changed: the harness edited what the model said.
    let reply_edited = kept == prev_messages.len();
    if dropped && added && !reply_edited {
        BreakKind::Summary
    } else {
        BreakKind::Other
    }
}

/// Whether `next` is another agent's call: another system prompt (its
/// first system or developer message), agent tag or tool list.
fn other_agent(
    prev: &impl Call,
    next: &impl Call,
    prev_messages: &[serde_json::Value],
    next_messages: &[serde_json::Value],
) -> bool {
    fn tools(c: &impl Call) -> Option<serde_json::Value> {
        call::request(c).ok()?.get("tools").cloned()
    }
    let system = |ms: &[serde_json::Value]| {
        ms.first()
            .filter(|m| {
                matches!(
                    m.get("role").and_then(|r| r.as_str()),
                    Some("system" | "developer")
                )
            })
            .cloned()
    };
    let other_system = match (system(prev_messages), system(next_messages)) {
        (Some(a), Some(b)) => !messages::same_message(&a, &b),
        (a, b) => a.is_some() != b.is_some(),
    };
    other_system || call::agent(prev) != call::agent(next) || tools(prev) != tools(next)
}

fn completion_history(prev: &impl Call, next: &impl Call) -> History {
    let (Some(prev_prompt), Some(reply), Some(next_prompt)) = (
        call::completion_prompt(prev),
        call::assistant_text(prev).or(Some(String::new())),
        call::completion_prompt(next),
    ) else {
        return History::Unknown;
    };
    if next_prompt.starts_with(&prev_prompt) && next_prompt[prev_prompt.len()..].starts_with(&reply)
    {
        History::TextExtends
    } else {
        History::Edited(
            BreakKind::Other,
            "the prompt text does not continue the previous prompt and completion".into(),
        )
    }
}

/// With the tokenizer: whether the next prompt's text starts with the
/// previous prompt + response text. `Err` says why it cannot tell (no
/// tokenizer, or decoding failed).
fn retokenized(
    prev: &impl Call,
    next: &impl Call,
    decoder: Option<&dyn Decoder>,
) -> Result<bool, String> {
    let decoder = decoder.ok_or("no tokenizer")?;
    let previous = [&*prev.prompt_ids(), prev.response_ids()].concat();
    let decode = |ids: &[u32]| {
        decoder
            .decode(ids)
            .map_err(|e| format!("no decoded text: {e}"))
    };
    Ok(decode(&next.prompt_ids())?.starts_with(&decode(&previous)?))
}

/// Where the next prompt first differs from the previous prompt + response;
/// its `Display` is the `ids first differ at ...` part of a break detail.
pub struct Divergence {
    at: usize,
    prompt_len: usize,
    previous: Option<u32>,
    next: Option<u32>,
}

impl Divergence {
    pub fn locate(prev: &impl Call, next: &impl Call) -> Self {
        let (prev_prompt, next_prompt) = (prev.prompt_ids(), next.prompt_ids());
        let prompt_len = prev_prompt.len();
        let in_prompt = common_prefix_len(&prev_prompt, &next_prompt);
        let at = if in_prompt < prompt_len {
            in_prompt
        } else {
            prompt_len + common_prefix_len(prev.response_ids(), &next_prompt[prompt_len..])
        };
        let previous = prev_prompt
            .iter()
            .chain(prev.response_ids())
            .nth(at)
            .copied();
        Divergence {
            at,
            prompt_len,
            previous,
            next: next_prompt.get(at).copied(),
        }
    }

    /// Whether the ids first differ inside (the re-rendering of) the
    /// previous response rather than in its prompt.
    pub fn in_previous_response(&self) -> bool {
        self.at >= self.prompt_len
    }
}

impl std::fmt::Display for Divergence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let show = |id: Option<u32>| id.map_or("end".to_owned(), |id| id.to_string());
        let place = if self.in_previous_response() {
            format!("response position {}", self.at - self.prompt_len)
        } else {
            format!("prompt position {}", self.at)
        };
        write!(
            f,
            "ids first differ at {} ({place}): previous {}, next {}",
            self.at,
            show(self.previous),
            show(self.next)
        )
    }
}

//! Reading a model call: its tags, and its request and response JSON
//! (fetched from the host and parsed on demand: a long rollout carries
//! megabytes of JSON, and most adapters need only the token ids). The
//! readers are [`agl_samples::call`]'s, the rules the host merges by.

use std::borrow::Cow;

pub use agl_samples::call::{
    AGENT_TAG, assistant_message, assistant_text, completion_prompt, content_text, request,
    request_messages, response,
};
use agl_samples::{Api, Call, Choice, PromptLink};

use crate::{ApiKind, ModelCall, data};

/// The value of tag `key` (case-insensitive, as headers are).
pub fn tag<'a>(call: &'a ModelCall, key: &str) -> Option<&'a str> {
    call.tags
        .iter()
        .find(|t| t.key.eq_ignore_ascii_case(key))
        .map(|t| t.value.as_str())
}

/// The call's `x-agl-agent` tag.
pub fn agent(call: &ModelCall) -> Option<&str> {
    tag(call, AGENT_TAG)
}

/// A call of the rollout under way, as the rules read it: its JSON and
/// whole prompt fetched from the host when asked for.
impl Call for ModelCall {
    fn index(&self) -> u32 {
        self.index
    }

    fn api(&self) -> Api {
        match self.api {
            ApiKind::ChatCompletions => Api::ChatCompletions,
            ApiKind::Completions => Api::Completions,
            ApiKind::Responses => Api::Responses,
            ApiKind::AnthropicMessages => Api::AnthropicMessages,
        }
    }

    fn prompt_ids(&self) -> Cow<'_, [u32]> {
        data::prompt_ids(self)
    }

    fn prompt_link(&self) -> Option<PromptLink<'_>> {
        Some(PromptLink {
            extends: self.prompt.extends,
            shared: self.prompt.shared as usize,
            tail: &self.prompt.tail,
        })
    }

    fn response_ids(&self) -> &[u32] {
        &self.response_ids
    }

    fn response_logprobs(&self) -> &[f32] {
        &self.response_logprobs
    }

    fn weight_version(&self) -> u64 {
        self.weight_version
    }

    fn tag(&self, key: &str) -> Option<&str> {
        tag(self, key)
    }

    fn continues(&self) -> Option<u32> {
        self.continues
    }

    fn choice(&self) -> Option<Choice> {
        self.choice.map(|c| Choice {
            index: c.index,
            count: c.count,
        })
    }

    fn request_json(&self) -> Option<Cow<'_, str>> {
        data::request_json(self).ok().map(Cow::Owned)
    }

    fn response_json(&self) -> Option<Cow<'_, str>> {
        data::response_json(self).ok().map(Cow::Owned)
    }
}

//! `agl:adapter/samples` (0.6): the host merges the rollout under way and
//! classifies its breaks by [`agl_samples`]' rules, over its own records
//! (whole prompts and JSON at hand, nothing copied into the guest). The
//! same for `agl plugin rules` (the Python SDK's native stand-in):
//! [`merge_calls`], [`classify`].

use std::borrow::Cow;
use std::sync::Arc;

use agl_samples::links::{Link, prompt_links};
use agl_samples::{Api, Call, Choice, Decoder, PromptLink};
use agl_tokenizer::Tokenizer;
use agl_wire::rollout::{self, ModelCall, Rollout};

use super::bindings::v0_6::sample::agl::adapter::samples;
use super::bindings::wit;
use super::state::PluginState;

/// A host record as the rules read it, with the link its prompt is handed
/// over by where there is one (a prompt linked to its chain's last call in
/// full then joins by its tail, as in the guest, not by a whole compare).
#[derive(Clone, Copy)]
pub struct WireCall<'a>(pub &'a ModelCall, pub Option<(Option<u32>, usize)>);

impl Call for WireCall<'_> {
    fn index(&self) -> u32 {
        self.0.index
    }

    fn api(&self) -> Api {
        match self.0.api {
            rollout::ApiKind::ChatCompletions => Api::ChatCompletions,
            rollout::ApiKind::Completions => Api::Completions,
            rollout::ApiKind::Responses => Api::Responses,
            rollout::ApiKind::AnthropicMessages => Api::AnthropicMessages,
        }
    }

    fn prompt_ids(&self) -> Cow<'_, [u32]> {
        Cow::Borrowed(&self.0.prompt_ids)
    }

    fn prompt_link(&self) -> Option<PromptLink<'_>> {
        let (extends, shared) = self.1?;
        let tail = self.0.prompt_ids.get(shared..)?;
        Some(PromptLink {
            extends,
            shared,
            tail,
        })
    }

    fn response_ids(&self) -> &[u32] {
        &self.0.response_ids
    }

    fn response_logprobs(&self) -> &[f32] {
        &self.0.response_logprobs
    }

    fn weight_version(&self) -> u64 {
        self.0.weight_version
    }

    fn tag(&self, key: &str) -> Option<&str> {
        // The gateway records tag names lower-cased.
        self.0
            .tags
            .get(&key.to_ascii_lowercase())
            .map(String::as_str)
    }

    fn continues(&self) -> Option<u32> {
        self.0.continues
    }

    fn choice(&self) -> Option<Choice> {
        self.0.choice.map(|c| Choice {
            index: c.index,
            count: c.count,
        })
    }

    fn request_json(&self) -> Option<Cow<'_, str>> {
        Some(Cow::Borrowed(self.0.request.as_str()))
    }

    fn response_json(&self) -> Option<Cow<'_, str>> {
        Some(Cow::Borrowed(self.0.response.as_str()))
    }
}

/// The records of `calls` as the rules read them.
pub fn wire_calls(calls: &[ModelCall]) -> Vec<WireCall<'_>> {
    calls.iter().map(|c| WireCall(c, None)).collect()
}

/// The same with their prompts' `links` (one per call).
fn linked_calls<'a>(calls: &'a [ModelCall], links: &[Link]) -> Vec<WireCall<'a>> {
    let index = |at: usize| calls[at].index;
    let link = |l: &Link| Some((l.extends.map(index), l.shared));
    calls
        .iter()
        .zip(links)
        .map(|(c, l)| WireCall(c, link(l)))
        .collect()
}

/// The host tokenizer as the break rules decode with it.
struct Decoding<'a>(&'a Tokenizer);

impl Decoder for Decoding<'_> {
    fn decode(&self, ids: &[u32]) -> Result<String, String> {
        // Guest-chosen ids reach third-party code: a panic is an error.
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.0.decode(ids, false)))
            .map_err(|_| "the host tokenizer panicked on these ids".to_string())?
            .map_err(|e| e.to_string())
    }
}

/// The rollout's calls merged by the host's rules (their samples are
/// agl's, `agl_wire::rollout::Sample`); `links` are their prompts' where
/// they were found already.
pub fn merge_calls(
    rollout: &Rollout,
    links: Option<&[Link]>,
    options: &agl_samples::MergeOptions,
    tokenizer: Option<&Tokenizer>,
) -> Vec<agl_samples::Merged> {
    let found;
    let links = match links {
        Some(links) => links,
        None => {
            found = prompt_links(&wire_calls(&rollout.calls));
            &found
        }
    };
    let decoder = tokenizer.map(Decoding);
    let decoder = decoder.as_ref().map(|d| d as &dyn Decoder);
    agl_samples::merge(&linked_calls(&rollout.calls, links), options, decoder)
}

/// Why call `next` did not continue call `prev`, by the host's rules.
pub fn classify(
    rollout: &Rollout,
    prev: u32,
    next: u32,
    tokenizer: Option<&Tokenizer>,
) -> Result<agl_samples::ChainBreak, String> {
    let call = |index: u32| {
        let found = rollout.calls.iter().find(|c| c.index == index);
        found
            .map(|c| WireCall(c, None))
            .ok_or_else(|| format!("the rollout has no call {index}"))
    };
    let decoder = tokenizer.map(Decoding);
    let decoder = decoder.as_ref().map(|d| d as &dyn Decoder);
    Ok(agl_samples::classify_break(
        &call(prev)?,
        &call(next)?,
        decoder,
    ))
}

impl PluginState {
    /// The prompt links of the rollout under way (`model-call.prompt`),
    /// found once per call for the call records and the host's merge.
    pub(crate) fn links(&mut self) -> Arc<Vec<Link>> {
        if let (None, Some(r)) = (&self.links, &self.rollout) {
            self.links = Some(Arc::new(prompt_links(&wire_calls(&r.calls))));
        }
        self.links.clone().unwrap_or_default()
    }
}

const NO_ROLLOUT: &str = "no rollout under way: the host merges only during build-samples";

impl samples::Host for PluginState {
    fn merge(&mut self, options: samples::MergeOptions) -> Result<Vec<samples::Merged>, String> {
        let rollout = self.rollout.clone().ok_or(NO_ROLLOUT)?;
        let options = agl_samples::MergeOptions {
            chain_by_agent: options.chain_by_agent,
            skip_empty_responses: options.skip_empty_responses,
            summary_markers: options.summary_markers,
        };
        let links = self.links();
        let tokenizer = self.env.tokenizer.clone();
        let merged = merge_calls(&rollout, Some(&links), &options, tokenizer.as_deref());
        Ok(merged
            .into_iter()
            .map(|m| samples::Merged {
                sample: to_wit(m.sample),
                after: m.after,
            })
            .collect())
    }

    fn classify_break(&mut self, prev: u32, next: u32) -> Result<wit::ChainBreak, String> {
        let rollout = self.rollout.clone().ok_or(NO_ROLLOUT)?;
        classify(&rollout, prev, next, self.env.tokenizer.as_deref()).map(break_to_wit)
    }
}

fn to_wit(s: agl_samples::Sample) -> wit::Sample {
    agl_samples::convert_sample!(s => wit::Sample, wit::Span, wit::ChainBreak, kind_to_wit)
}

fn break_to_wit(b: agl_samples::ChainBreak) -> wit::ChainBreak {
    wit::ChainBreak {
        kind: kind_to_wit(b.kind),
        call_index: b.call_index,
        detail: b.detail,
    }
}

fn kind_to_wit(kind: agl_samples::BreakKind) -> wit::BreakKind {
    use agl_samples::BreakKind as K;
    match kind {
        K::Retokenize => wit::BreakKind::Retokenize,
        K::Template => wit::BreakKind::Template,
        K::Other => wit::BreakKind::Other,
        K::Summary => wit::BreakKind::Summary,
        K::SubAgent => wit::BreakKind::SubAgent,
    }
}

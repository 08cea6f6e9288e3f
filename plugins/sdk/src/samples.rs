//! Building samples: the host merges the rollout under way and classifies
//! its breaks (`agl:adapter/samples`, by [`agl_samples`]' rules; natively
//! the same rules run here over the rollout [`crate::testing`] serves).

#[cfg(not(target_arch = "wasm32"))]
use agl_samples::Decoder;
pub use agl_samples::{MergeOptions, NotAContinuation};

use crate::{BreakKind, ChainBreak, ModelCall, Rollout, Sample, Span};

#[cfg(target_arch = "wasm32")]
use crate::bindings::adapter::agl::adapter::samples as host;

/// Merges the rollout's calls into as few samples as the ids allow, one
/// chain per agent (see `merge` in `wit/agl.wit`'s `interface samples`),
/// the breaks classified by the host's rules and `options.summary_markers`.
///
/// # Panics
/// For a rollout that is not the one under way (the host merges only that
/// one, during `build-samples`): a plugin bug, which fails this rollout's
/// plugin call with the message, never the host.
pub fn merge_chains(rollout: &Rollout, options: &MergeOptions) -> Vec<Sample> {
    merged(rollout, options)
        .into_iter()
        .map(|(sample, _)| sample)
        .collect()
}

/// [`merge_chains`] with a harness's own break classifier: `classify` gets
/// the last call of the chain and the call that did not continue it, and
/// its break replaces the host's (a harness adapter can name breaks the
/// host only calls `other`, then fall back to [`classify_break`]).
pub fn merge_chains_with(
    rollout: &Rollout,
    options: &MergeOptions,
    classify: impl Fn(&ModelCall, &ModelCall) -> ChainBreak,
) -> Vec<Sample> {
    let call = |index: u32| rollout.calls.iter().find(|c| c.index == index);
    merged(rollout, options)
        .into_iter()
        .map(|(mut sample, after)| {
            let first = sample.source_calls.first().copied();
            if let (Some(prev), Some(next)) = (after.and_then(call), first.and_then(call)) {
                sample.break_before = Some(classify(prev, next));
            }
            sample
        })
        .collect()
}

/// The config of an adapter that merges and takes no other keys
/// (`[plugin.NAME]`: `chain_by_agent`, default `true`).
#[derive(Debug, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
struct MergeConfig {
    chain_by_agent: bool,
}

impl Default for MergeConfig {
    fn default() -> Self {
        MergeConfig {
            chain_by_agent: true,
        }
    }
}

/// [`merge_chains`] under the options the plugin's config gives
/// (`chain_by_agent`; empty responses skipped): the whole `build-samples`
/// of an adapter that only merges.
pub fn merge_configured(rollout: &Rollout) -> Result<Vec<Sample>, String> {
    let config: MergeConfig = crate::config()?;
    let options = MergeOptions {
        chain_by_agent: config.chain_by_agent,
        ..MergeOptions::default()
    };
    Ok(merge_chains(rollout, &options))
}

/// Why `next`'s prompt does not start with `prev`'s prompt + response
/// (`prev` being the last call of the chain), by the host's rules.
pub fn classify_break(prev: &ModelCall, next: &ModelCall) -> ChainBreak {
    #[cfg(target_arch = "wasm32")]
    return host::classify_break(prev.index, next.index).unwrap_or_else(|e| panic!("{e}"));
    #[cfg(not(target_arch = "wasm32"))]
    return from_rules_break(agl_samples::classify_break(prev, next, decoder()));
}

/// Each merged sample and the call whose chain its first call broke.
fn merged(rollout: &Rollout, options: &MergeOptions) -> Vec<(Sample, Option<u32>)> {
    #[cfg(target_arch = "wasm32")]
    {
        let _ = rollout;
        let options = host::MergeOptions {
            chain_by_agent: options.chain_by_agent,
            skip_empty_responses: options.skip_empty_responses,
            summary_markers: options.summary_markers.clone(),
        };
        host::merge(&options)
            .unwrap_or_else(|e| panic!("{e}"))
            .into_iter()
            .map(|m| (m.sample, m.after))
            .collect()
    }
    #[cfg(not(target_arch = "wasm32"))]
    agl_samples::merge(&rollout.calls, options, decoder())
        .into_iter()
        .map(|m| (from_rules(m.sample), m.after))
        .collect()
}

/// The tokenizer the plugin may use, as the break rules decode with it.
#[cfg(not(target_arch = "wasm32"))]
struct HostTokenizer;

#[cfg(not(target_arch = "wasm32"))]
impl Decoder for HostTokenizer {
    fn decode(&self, ids: &[u32]) -> Result<String, String> {
        crate::tokenizer::decode(ids, false)
    }
}

#[cfg(not(target_arch = "wasm32"))]
fn decoder() -> Option<&'static dyn Decoder> {
    crate::tokenizer::available().then_some(&HostTokenizer as &dyn Decoder)
}

/// Accumulates calls into one sample (see [`agl_samples::SampleBuilder`]):
/// the first call's prompt is the sample's prompt, its response the first
/// trainable span; each extension adds the next call's new prompt tokens
/// as masked context, then its response as the next trainable span.
#[derive(Debug, Clone)]
pub struct SampleBuilder(agl_samples::SampleBuilder);

impl SampleBuilder {
    /// A sample of exactly one call, its whole response trainable.
    pub fn from_call(call: &ModelCall) -> Self {
        SampleBuilder(agl_samples::SampleBuilder::from_call(call))
    }

    /// Records why the previous sample ended where this one begins.
    pub fn with_break(self, chain_break: ChainBreak) -> Self {
        SampleBuilder(self.0.with_break(to_rules_break(chain_break)))
    }

    /// Length of `prompt ++ response` so far.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Never true: a sample starts from a call's prompt.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether `next`'s prompt starts with this sample's `prompt ++ response`.
    pub fn continues(&self, next: &ModelCall) -> bool {
        self.0.continues(next)
    }

    /// Appends `next` if it continues the sample; otherwise leaves the
    /// sample unchanged and says where the ids first differ.
    pub fn extend(&mut self, next: &ModelCall) -> Result<(), NotAContinuation> {
        self.0.extend(next)
    }

    pub fn build(self) -> Sample {
        from_rules(self.0.build())
    }
}

fn from_rules(s: agl_samples::Sample) -> Sample {
    agl_samples::convert_sample!(s => Sample, Span, ChainBreak, kind_from_rules)
}

#[cfg(not(target_arch = "wasm32"))]
fn from_rules_break(b: agl_samples::ChainBreak) -> ChainBreak {
    ChainBreak {
        kind: kind_from_rules(b.kind),
        call_index: b.call_index,
        detail: b.detail,
    }
}

fn kind_from_rules(kind: agl_samples::BreakKind) -> BreakKind {
    use agl_samples::BreakKind as K;
    match kind {
        K::Retokenize => BreakKind::Retokenize,
        K::Template => BreakKind::Template,
        K::Other => BreakKind::Other,
        K::Summary => BreakKind::Summary,
        K::SubAgent => BreakKind::SubAgent,
    }
}

fn to_rules_break(b: ChainBreak) -> agl_samples::ChainBreak {
    use agl_samples::BreakKind as K;
    agl_samples::ChainBreak {
        kind: match b.kind {
            BreakKind::Retokenize => K::Retokenize,
            BreakKind::Template => K::Template,
            BreakKind::Other => K::Other,
            BreakKind::Summary => K::Summary,
            BreakKind::SubAgent => K::SubAgent,
        },
        call_index: b.call_index,
        detail: b.detail,
    }
}

//! Merging a rollout's calls into as few samples as exact token prefixes
//! allow, one chain per agent.

use crate::builder::SampleBuilder;
use crate::{ChainBreak, ModelCall, Rollout, Sample, breaks, call, log};

/// How [`merge_chains`] groups calls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MergeOptions {
    /// Keep one chain per `x-agl-agent` tag, so interleaved sub-agents do
    /// not break each other's chains (calls without the tag share one
    /// default chain). Off: all calls form one chain.
    pub chain_by_agent: bool,
    /// Skip calls that produced no tokens (failed or cancelled calls); they
    /// have nothing to train and would break the chain.
    pub skip_empty_responses: bool,
}

impl Default for MergeOptions {
    fn default() -> Self {
        MergeOptions {
            chain_by_agent: true,
            skip_empty_responses: true,
        }
    }
}

/// One open chain: the sample being built and the call that ended it.
struct Chain<'a> {
    key: Option<&'a str>,
    builder: SampleBuilder,
    last: &'a ModelCall,
}

/// Merges calls into samples: a call whose prompt ids start with its
/// chain's `prompt ++ response` so far is appended (new prompt tokens
/// masked, its response trained); any other call closes the chain's sample
/// and starts a new one whose `break_before` says why. Samples come out
/// ordered by their first call.
pub fn merge_chains(rollout: &Rollout, options: &MergeOptions) -> Vec<Sample> {
    merge_chains_with(rollout, options, breaks::classify_break)
}

/// [`merge_chains`] with a harness-specific break classifier: `classify`
/// gets the last call of the chain and the call that did not continue it
/// (a harness adapter can name breaks the generic classifier only calls
/// `other`, then fall back to [`breaks::classify_break`]).
pub fn merge_chains_with(
    rollout: &Rollout,
    options: &MergeOptions,
    classify: impl Fn(&ModelCall, &ModelCall) -> ChainBreak,
) -> Vec<Sample> {
    let mut open: Vec<Chain> = Vec::new();
    let mut done: Vec<Sample> = Vec::new();
    for next in &rollout.calls {
        if options.skip_empty_responses && next.response_ids.is_empty() {
            log::debug(format!("call {}: no response tokens, skipped", next.index));
            continue;
        }
        let key = if options.chain_by_agent {
            call::agent(next)
        } else {
            None
        };
        let Some(chain) = open.iter_mut().find(|c| c.key == key) else {
            open.push(Chain {
                key,
                builder: SampleBuilder::from_call(next),
                last: next,
            });
            continue;
        };
        if chain.builder.extend(next).is_err() {
            let chain_break = classify(chain.last, next);
            let kind = breaks::kind_name(chain_break.kind);
            log::debug(format!(
                "call {}: new sample, {kind} break: {}",
                next.index, chain_break.detail
            ));
            let fresh = SampleBuilder::from_call(next).with_break(chain_break);
            done.push(std::mem::replace(&mut chain.builder, fresh).build());
        }
        chain.last = next;
    }
    done.extend(open.into_iter().map(|c| c.builder.build()));
    done.sort_by_key(|s| s.source_calls.first().copied());
    done
}

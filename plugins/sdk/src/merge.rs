//! Merging a rollout's calls into as few samples as the gateway's
//! continuation links and exact token prefixes allow, one chain per agent.

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

/// [`merge_chains_with`] under the options the plugin's config gives
/// (`chain_by_agent`; empty responses skipped): the whole `build-samples`
/// of an adapter that only merges, with its own break classifier.
pub fn merge_configured(
    rollout: &Rollout,
    classify: impl Fn(&ModelCall, &ModelCall) -> ChainBreak,
) -> Result<Vec<Sample>, String> {
    let config: MergeConfig = crate::config()?;
    let options = MergeOptions {
        chain_by_agent: config.chain_by_agent,
        skip_empty_responses: true,
    };
    Ok(merge_chains_with(rollout, &options, classify))
}

/// One chain: the sample being built and its last call.
struct Chain<'a> {
    key: Option<&'a str>,
    builder: SampleBuilder,
    last: &'a ModelCall,
}

/// Merges calls into samples. A call the gateway recorded as continuing
/// call `j` (`continues`) joins the chain that ends with `j`. Any other
/// call is tested against its agent's latest chain: if its prompt ids start
/// with that chain's `prompt ++ response` so far it is appended (new prompt
/// tokens masked, its response trained); if not, it starts a new sample
/// whose `break_before` says why. Chains are never closed, so a linked call
/// goes back to its chain after another agent's turns. Samples come out
/// ordered by their first call.
///
/// The choices of an `n` > 1 request (`choice`) are parallel samples: the
/// first joins the chain as any call would, each sibling forks its own
/// sample (no break: nothing before it is trained twice), and the next call
/// joins whichever sibling's chain it extends, i.e. the choice the harness
/// kept.
pub fn merge_chains(rollout: &Rollout, options: &MergeOptions) -> Vec<Sample> {
    merge_chains_with(rollout, options, breaks::classify_break)
}

/// The first call index of `call`'s choices (its own index without any).
fn first_choice(call: &ModelCall) -> u32 {
    call.index
        .saturating_sub(call.choice.map_or(0, |c| c.index))
}

/// Whether `a` and `b` are choices of the same request.
fn siblings(a: &ModelCall, b: &ModelCall) -> bool {
    a.choice.is_some()
        && a.choice.map(|c| c.count) == b.choice.map(|c| c.count)
        && first_choice(a) == first_choice(b)
}

/// Appends `next` to the chain at `latest` (its agent's latest), or to the
/// chain of a sibling choice of that chain's last call: the first that
/// `next` extends. `Err` names the one whose ids `next` follows longest.
fn join_latest<'a>(
    chains: &mut [Chain<'a>],
    latest: usize,
    next: &'a ModelCall,
) -> Result<(), usize> {
    let (key, tip) = (chains[latest].key, chains[latest].last);
    let mut closest: Option<(usize, usize)> = None;
    for i in (0..chains.len()).rev() {
        let chain = &mut chains[i];
        if chain.key != key || !(i == latest || siblings(chain.last, tip)) {
            continue;
        }
        match chain.builder.extend(next) {
            Ok(()) => {
                chain.last = next;
                return Ok(());
            }
            Err(e) if closest.is_none_or(|(_, at)| e.at > at) => closest = Some((i, e.at)),
            Err(_) => {}
        }
    }
    Err(closest.map_or(latest, |(i, _)| i))
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
    let mut chains: Vec<Chain> = Vec::new();
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
        // A later choice of a request whose earlier choice has a chain
        // already: a sample of its own beside it.
        if chains.iter().any(|c| siblings(c.last, next)) {
            chains.push(Chain {
                key,
                builder: SampleBuilder::from_call(next),
                last: next,
            });
            continue;
        }
        if let Some(target) = next.continues {
            if let Some(chain) = chains.iter_mut().rev().find(|c| c.last.index == target)
                && chain.builder.extend(next).is_ok()
            {
                chain.last = next;
                continue;
            }
            // A skipped target, or a second call continuing the same one
            // (the chain has moved on): the id test decides.
            log::debug(format!(
                "call {}: continues call {target}, which ends no chain",
                next.index
            ));
        }
        // The agent's latest chain, and the chains of its siblings when
        // it ended with one choice of several: the one `next` extends.
        let latest = chains.iter().rposition(|c| c.key == key);
        let builder = match latest {
            None => SampleBuilder::from_call(next),
            Some(latest) => {
                let Err(broken) = join_latest(&mut chains, latest, next) else {
                    continue;
                };
                let chain_break = classify(chains[broken].last, next);
                let kind = breaks::kind_name(chain_break.kind);
                log::debug(format!(
                    "call {}: new sample, {kind} break: {}",
                    next.index, chain_break.detail
                ));
                SampleBuilder::from_call(next).with_break(chain_break)
            }
        };
        chains.push(Chain {
            key,
            builder,
            last: next,
        });
    }
    // Chains start in call order, so their samples are ordered already.
    chains.into_iter().map(|c| c.builder.build()).collect()
}

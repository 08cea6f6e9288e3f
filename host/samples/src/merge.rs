//! Merging a rollout's calls into as few samples as the gateway's
//! continuation links and exact token prefixes allow, one chain per agent.

use crate::breaks::{classify_break, marked_summary};
use crate::builder::SampleBuilder;
use crate::call::{Call, Decoder, agent};
use crate::{ChainBreak, Sample};

/// How [`merge`] groups calls (`merge-options` in `wit/agl.wit`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MergeOptions {
    /// Keep one chain per `x-agl-agent` tag, so interleaved sub-agents do
    /// not break each other's chains (calls without the tag share one
    /// default chain). Off: all calls form one chain.
    pub chain_by_agent: bool,
    /// Skip calls that produced no tokens (failed or cancelled calls); they
    /// have nothing to train and would break the chain.
    pub skip_empty_responses: bool,
    /// The texts a harness opens a compaction summary with: a call whose
    /// history holds one that its chain's did not breaks as `summary`
    /// ([`marked_summary`]).
    pub summary_markers: Vec<String>,
}

impl Default for MergeOptions {
    fn default() -> Self {
        MergeOptions {
            chain_by_agent: true,
            skip_empty_responses: true,
            summary_markers: Vec::new(),
        }
    }
}

/// A merged sample and, when it starts with a break, the last call of the
/// chain its first call did not continue: an adapter that names breaks its
/// own way classifies `(after, first call)` again.
#[derive(Debug, Clone, PartialEq)]
pub struct Merged {
    pub sample: Sample,
    pub after: Option<u32>,
}

/// One chain: the sample being built and its last call.
struct Chain<'a, C> {
    key: Option<&'a str>,
    builder: SampleBuilder,
    last: &'a C,
    after: Option<u32>,
}

/// The first call index of `call`'s choices (its own index without any).
fn first_choice(call: &impl Call) -> u32 {
    call.index()
        .saturating_sub(call.choice().map_or(0, |c| c.index))
}

/// Whether `a` and `b` are choices of the same request.
fn siblings(a: &impl Call, b: &impl Call) -> bool {
    a.choice().is_some()
        && a.choice().map(|c| c.count) == b.choice().map(|c| c.count)
        && first_choice(a) == first_choice(b)
}

/// Appends `next` to the chain at `latest` (its agent's latest), or to the
/// chain of a sibling choice of that chain's last call: the first that
/// `next` extends. `Err` names the one whose ids `next` follows longest.
fn join_latest<'a, C: Call>(
    chains: &mut [Chain<'a, C>],
    latest: usize,
    next: &'a C,
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
///
/// A broken chain is classified by `options.summary_markers`
/// ([`marked_summary`]), then [`classify_break`] (with `decoder`, where
/// the caller has the tokenizer).
pub fn merge<C: Call>(
    calls: &[C],
    options: &MergeOptions,
    decoder: Option<&dyn Decoder>,
) -> Vec<Merged> {
    let markers: Vec<&str> = options.summary_markers.iter().map(String::as_str).collect();
    let classify = |prev: &C, next: &C| -> ChainBreak {
        marked_summary(prev, next, &markers).unwrap_or_else(|| classify_break(prev, next, decoder))
    };
    let mut chains: Vec<Chain<C>> = Vec::new();
    for next in calls {
        if options.skip_empty_responses && next.response_ids().is_empty() {
            continue;
        }
        let key = if options.chain_by_agent {
            agent(next)
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
                after: None,
            });
            continue;
        }
        // A skipped target, or a second call continuing the same one (the
        // chain has moved on): the id test below decides.
        if let Some(target) = next.continues()
            && let Some(chain) = chains.iter_mut().rev().find(|c| c.last.index() == target)
            && chain.builder.extend(next).is_ok()
        {
            chain.last = next;
            continue;
        }
        // The agent's latest chain, and the chains of its siblings when
        // it ended with one choice of several: the one `next` extends.
        let latest = chains.iter().rposition(|c| c.key == key);
        let (builder, after) = match latest {
            None => (SampleBuilder::from_call(next), None),
            Some(latest) => {
                let Err(broken) = join_latest(&mut chains, latest, next) else {
                    continue;
                };
                let prev = chains[broken].last;
                let builder = SampleBuilder::from_call(next).with_break(classify(prev, next));
                (builder, Some(prev.index()))
            }
        };
        chains.push(Chain {
            key,
            builder,
            last: next,
            after,
        });
    }
    // Chains start in call order, so their samples are ordered already.
    chains
        .into_iter()
        .map(|c| Merged {
            sample: c.builder.build(),
            after: c.after,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::call::{AGENT_TAG, Choice};
    use crate::links::prompt_links;
    use crate::test_calls::{TestCall, call};

    fn tagged(mut c: TestCall, agent: &str) -> TestCall {
        c.tags.push((AGENT_TAG.into(), agent.into()));
        c
    }

    fn choice(c: TestCall, index: u32) -> TestCall {
        TestCall {
            choice: Some(Choice { index, count: 3 }),
            ..c
        }
    }

    /// Rollouts that take each path of the merge: a clean chain, a changed
    /// prompt, interleaved agents, a gateway link, choices, an empty
    /// response.
    fn rollouts() -> Vec<Vec<TestCall>> {
        let mut linked = call(1, &[1, 2, 3, 4], &[5]);
        linked.continues = Some(0);
        let mut again = call(2, &[1, 2, 3, 4], &[6]);
        again.continues = Some(0);
        let choices = |last: &[u32]| {
            vec![
                call(0, &[1, 2], &[10]),
                choice(call(1, &[1, 2, 10, 20], &[30, 31]), 0),
                choice(call(2, &[1, 2, 10, 20], &[40]), 1),
                choice(call(3, &[1, 2, 10, 20], &[50, 51, 52]), 2),
                call(4, last, &[60]),
            ]
        };
        vec![
            vec![
                call(0, &[1, 2], &[10, 11]),
                call(1, &[1, 2, 10, 11, 20], &[30]),
                call(2, &[1, 2, 10, 11, 20, 30, 21], &[40]),
            ],
            vec![call(0, &[1, 2], &[10]), call(1, &[1, 2, 99], &[11])],
            vec![
                call(0, &[1], &[2]),
                tagged(call(1, &[7], &[8]), "sub"),
                call(2, &[1, 2, 3], &[4]),
                tagged(call(3, &[7, 8, 9], &[10]), "sub"),
                tagged(call(4, &[1, 2, 3, 4, 5], &[6]), "sub"),
            ],
            vec![call(0, &[1, 2], &[3]), linked, again],
            choices(&[1, 2, 10, 20, 50, 51, 52, 21]),
            choices(&[1, 2, 10, 20, 50, 51, 99, 21]),
            vec![
                call(0, &[1], &[2]),
                call(1, &[1, 2, 3], &[]),
                call(2, &[1, 2, 3], &[4]),
            ],
        ]
    }

    /// What a guest merges from (each prompt linked as the host links it)
    /// merges as the whole prompts the host holds, mostly by tails alone.
    #[test]
    fn linked_prompts_merge_as_whole_ones() {
        let (mut by_tails, mut whole_fetches) = (0, 0);
        for whole in rollouts() {
            let links = prompt_links(&whole);
            let linked: Vec<TestCall> = whole
                .iter()
                .zip(&links)
                .map(|(c, l)| TestCall {
                    link: Some((l.extends.map(|at| whole[at].index), l.shared)),
                    ..c.clone()
                })
                .collect();
            for chain_by_agent in [true, false] {
                let options = MergeOptions {
                    chain_by_agent,
                    ..MergeOptions::default()
                };
                let merged = merge(&linked, &options, None);
                assert_eq!(merged, merge(&whole, &options, None), "{whole:?}");
            }
            by_tails += linked.iter().map(|c| c.fetched.get()).sum::<usize>();
            whole_fetches += whole.iter().map(|c| c.fetched.get()).sum::<usize>();
        }
        // Not vacuous: linked calls joined by their tails, unfetched.
        assert!(
            by_tails < whole_fetches,
            "{by_tails} whole prompts asked for with links, {whole_fetches} without"
        );
    }
}

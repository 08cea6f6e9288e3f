//! The host's rule for `model-call.prompt` (`wit/agl.wit`, `record
//! prompt`), for hand-made rollouts: each prompt is linked to the call
//! among the gateway's `continues` target and the latest calls with
//! response ids (of its agent, and of any), with their sibling choices,
//! whose `prompt ++ response` it shares the longest start with.

use std::collections::HashMap;

use super::TestCall;
use crate::call::agent;
use crate::prefix::common_prefix_len;

/// `(extends, shared)` of every call, `extends` as a call index.
pub(super) fn prompt_links(calls: &[TestCall]) -> Vec<(Option<u32>, usize)> {
    let mut links = Vec::with_capacity(calls.len());
    let mut latest_of_agent: HashMap<Option<&str>, usize> = HashMap::new();
    let mut latest: Option<usize> = None;
    for (at, call) in calls.iter().enumerate() {
        let key = agent(call);
        let mut candidates = Vec::new();
        if let Some(target) = call.continues {
            candidates.extend(calls[..at].iter().rposition(|c| c.index == target));
        }
        for tip in [latest_of_agent.get(&key).copied(), latest]
            .into_iter()
            .flatten()
        {
            candidates.extend(with_siblings(calls, tip, at));
        }
        candidates.sort_unstable();
        candidates.dedup();
        let best = candidates
            .into_iter()
            .map(|c| (shared_start(call.prompt_ids(), &calls[c]), c))
            .filter(|&(shared, _)| shared > 0)
            .max();
        links.push(best.map_or((None, 0), |(shared, c)| (Some(calls[c].index), shared)));
        if !call.response_ids.is_empty() {
            latest_of_agent.insert(key, at);
            latest = Some(at);
        }
    }
    links
}

fn with_siblings(calls: &[TestCall], tip: usize, before: usize) -> Vec<usize> {
    let Some(choice) = calls[tip].choice else {
        return vec![tip];
    };
    let first = tip.saturating_sub(choice.index as usize);
    let end = (first + choice.count as usize).min(before);
    (first..end)
        .filter(|&c| calls[c].choice.is_some_and(|s| s.count == choice.count))
        .collect()
}

fn shared_start(prompt: &[u32], call: &TestCall) -> usize {
    let in_prompt = common_prefix_len(prompt, call.prompt_ids());
    if in_prompt < call.prompt_ids().len() {
        return in_prompt;
    }
    in_prompt + common_prefix_len(&prompt[in_prompt..], &call.response_ids)
}

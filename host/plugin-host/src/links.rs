//! `model-call.prompt` of `agl:adapter@0.5`: each call's prompt as the
//! start it shares with an earlier call's `prompt ++ response` and the ids
//! after it, so the guest gets what a prompt adds instead of the whole
//! prompt again (a 50-call rollout repeats its history 50 times). The rule
//! for which earlier call is the one in `wit/agl.wit` (`record prompt`).

use std::collections::HashMap;

use agl_wire::rollout::ModelCall;

/// Where a call's prompt starts: the first `shared` ids of the call at
/// `extends` (an index into the rollout's calls, not the call's `index`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PromptLink {
    pub extends: Option<usize>,
    pub shared: usize,
}

/// The link of every call of `calls`, in order.
pub fn prompt_links(calls: &[ModelCall]) -> Vec<PromptLink> {
    let mut links = Vec::with_capacity(calls.len());
    // The latest call with response ids, per `x-agl-agent` tag and overall.
    let mut latest_of_agent: HashMap<Option<&str>, usize> = HashMap::new();
    let mut latest: Option<usize> = None;
    for (at, call) in calls.iter().enumerate() {
        let agent = call.tags.get(AGENT_TAG).map(String::as_str);
        let mut candidates: Vec<usize> = Vec::with_capacity(4);
        if let Some(target) = call.continues {
            candidates.extend(calls[..at].iter().rposition(|c| c.index == target));
        }
        for tip in [latest_of_agent.get(&agent).copied(), latest]
            .into_iter()
            .flatten()
        {
            candidates.extend(with_siblings(calls, tip, at));
        }
        candidates.sort_unstable();
        candidates.dedup();
        // The longest shared start; the latest call on a tie.
        let link = candidates
            .into_iter()
            .map(|c| PromptLink {
                extends: Some(c),
                shared: shared_start(&call.prompt_ids, &calls[c]),
            })
            .filter(|l| l.shared > 0)
            .max_by_key(|l| (l.shared, l.extends))
            .unwrap_or_default();
        links.push(link);
        if !call.response_ids.is_empty() {
            latest_of_agent.insert(agent, at);
            latest = Some(at);
        }
    }
    links
}

/// The tag a harness names its agent with (the SDK's `AGENT_TAG`).
const AGENT_TAG: &str = "x-agl-agent";

/// `tip` and the other choices of its request before `before` (siblings
/// are recorded next to each other).
fn with_siblings(calls: &[ModelCall], tip: usize, before: usize) -> Vec<usize> {
    let Some(choice) = calls[tip].choice else {
        return vec![tip];
    };
    let first = tip.saturating_sub(choice.index as usize);
    let end = (first + choice.count as usize).min(before);
    (first..end)
        .filter(|&c| calls[c].choice.is_some_and(|s| s.count == choice.count))
        .collect()
}

/// How many first ids `prompt` shares with `call`'s `prompt ++ response`.
fn shared_start(prompt: &[u32], call: &ModelCall) -> usize {
    let in_prompt = common_prefix_len(prompt, &call.prompt_ids);
    if in_prompt < call.prompt_ids.len() {
        return in_prompt;
    }
    in_prompt + common_prefix_len(&prompt[in_prompt..], &call.response_ids)
}

/// Ids compared per step once the two differ: slice equality on a block
/// is one `memcmp`.
const BLOCK: usize = 64;

/// Length of the longest common prefix of `a` and `b`.
pub fn common_prefix_len(a: &[u32], b: &[u32]) -> usize {
    let len = a.len().min(b.len());
    let (a, b) = (&a[..len], &b[..len]);
    // Most prompts continue the call they are linked to: one `memcmp`
    // over the whole length, then blocks only to find where they differ.
    if a == b {
        return len;
    }
    let mut start = 0;
    for (x, y) in a.chunks_exact(BLOCK).zip(b.chunks_exact(BLOCK)) {
        if x != y {
            break;
        }
        start += BLOCK;
    }
    start
        + a[start..]
            .iter()
            .zip(&b[start..])
            .take_while(|(x, y)| x == y)
            .count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_calls::call;
    use agl_wire::rollout::Choice;

    fn agent(mut c: ModelCall, name: &str) -> ModelCall {
        c.tags.insert(AGENT_TAG.into(), name.into());
        c
    }

    fn link(extends: usize, shared: usize) -> PromptLink {
        PromptLink {
            extends: Some(extends),
            shared,
        }
    }

    #[test]
    fn the_prefix_agrees_with_a_naive_compare_at_every_length() {
        for len in 0..150usize {
            let a: Vec<u32> = (0..len as u32).collect();
            for at in 0..len {
                let mut b = a.clone();
                b[at] ^= 1 << 31;
                assert_eq!(common_prefix_len(&a, &b), at);
            }
            assert_eq!(common_prefix_len(&a, &a), len);
            assert_eq!(common_prefix_len(&a, &a[..len / 2]), len / 2);
        }
    }

    #[test]
    fn a_chain_links_each_prompt_to_the_call_before_in_full() {
        let calls = vec![
            call(0, &[1, 2], &[3]),
            call(1, &[1, 2, 3, 4], &[5]),
            call(2, &[1, 2, 3, 4, 5, 6], &[7]),
        ];
        assert_eq!(
            prompt_links(&calls),
            vec![PromptLink::default(), link(0, 3), link(1, 5)]
        );
    }

    #[test]
    fn a_broken_prompt_says_where_it_first_differs() {
        // The second prompt re-renders the first response (3 -> 9).
        let calls = vec![call(0, &[1, 2], &[3, 4]), call(1, &[1, 2, 9, 4, 5], &[6])];
        assert_eq!(prompt_links(&calls)[1], link(0, 2));
        // Nothing shared: no link.
        let calls = vec![call(0, &[1, 2], &[3]), call(1, &[7, 8], &[9])];
        assert_eq!(prompt_links(&calls)[1], PromptLink::default());
    }

    #[test]
    fn each_agent_links_to_its_own_latest_call_and_failed_calls_are_passed_over() {
        let calls = vec![
            agent(call(0, &[1, 2], &[3]), "main"),
            agent(call(1, &[50, 51], &[52]), "helper"),
            // A failed call: no response, never a link target.
            agent(call(2, &[1, 2, 3, 4], &[]), "main"),
            agent(call(3, &[1, 2, 3, 4], &[5]), "main"),
            agent(call(4, &[50, 51, 52, 53], &[54]), "helper"),
        ];
        let links = prompt_links(&calls);
        assert_eq!(links[2], link(0, 3));
        assert_eq!(links[3], link(0, 3));
        assert_eq!(links[4], link(1, 3));
    }

    #[test]
    fn the_next_call_links_to_the_choice_the_harness_kept() {
        let choice = |c: ModelCall, index| ModelCall {
            choice: Some(Choice { index, count: 3 }),
            ..c
        };
        let calls = vec![
            choice(call(0, &[1], &[10]), 0),
            choice(call(1, &[1], &[11]), 1),
            choice(call(2, &[1], &[12]), 2),
            call(3, &[1, 11, 20], &[21]),
        ];
        let links = prompt_links(&calls);
        assert_eq!(links[1], link(0, 1));
        assert_eq!(links[3], link(1, 2));
    }

    #[test]
    fn the_gateway_link_is_a_candidate_beside_the_latest_calls() {
        // Call 2 continues call 0 (the gateway says so) though call 1, of
        // the same agent, came between.
        let mut next = call(2, &[1, 2, 3, 4], &[5]);
        next.continues = Some(0);
        let calls = vec![call(0, &[1, 2], &[3]), call(1, &[7], &[8]), next];
        assert_eq!(prompt_links(&calls)[2], link(0, 3));
    }
}

//! `model-call.prompt` of `agl:adapter@0.5` and later: each call's prompt
//! as the start it shares with an earlier call's `prompt ++ response` and
//! the ids after it, so the guest gets what a prompt adds instead of the
//! whole prompt again (a 50-call rollout repeats its history 50 times). The
//! rule for which earlier call is the one in `wit/agl.wit` (`record
//! prompt`).

use std::collections::HashMap;

use crate::call::{Call, agent};
use crate::prefix::common_prefix_len;

/// Where a call's prompt starts: the first `shared` ids of the call at
/// `extends` (an index into the rollout's calls, not the call's `index`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Link {
    pub extends: Option<usize>,
    pub shared: usize,
}

/// The link of every call of `calls`, in order.
pub fn prompt_links<C: Call>(calls: &[C]) -> Vec<Link> {
    let mut links = Vec::with_capacity(calls.len());
    // The latest call with response ids, per `x-agl-agent` tag and overall.
    let mut latest_of_agent: HashMap<Option<&str>, usize> = HashMap::new();
    let mut latest: Option<usize> = None;
    for (at, call) in calls.iter().enumerate() {
        let agent = agent(call);
        let mut candidates: Vec<usize> = Vec::with_capacity(4);
        if let Some(target) = call.continues() {
            candidates.extend(calls[..at].iter().rposition(|c| c.index() == target));
        }
        for tip in [latest_of_agent.get(&agent).copied(), latest]
            .into_iter()
            .flatten()
        {
            candidates.extend(with_siblings(calls, tip, at));
        }
        candidates.sort_unstable();
        candidates.dedup();
        let prompt = call.prompt_ids();
        // The longest shared start; the latest call on a tie.
        let link = candidates
            .into_iter()
            .map(|c| Link {
                extends: Some(c),
                shared: shared_start(&prompt, &calls[c]),
            })
            .filter(|l| l.shared > 0)
            .max_by_key(|l| (l.shared, l.extends))
            .unwrap_or_default();
        links.push(link);
        if !call.response_ids().is_empty() {
            latest_of_agent.insert(agent, at);
            latest = Some(at);
        }
    }
    links
}

/// `tip` and the other choices of its request before `before` (siblings
/// are recorded next to each other).
fn with_siblings<C: Call>(calls: &[C], tip: usize, before: usize) -> Vec<usize> {
    let Some(choice) = calls[tip].choice() else {
        return vec![tip];
    };
    let first = tip.saturating_sub(choice.index as usize);
    let end = (first + choice.count as usize).min(before);
    (first..end)
        .filter(|&c| calls[c].choice().is_some_and(|s| s.count == choice.count))
        .collect()
}

/// How many first ids `prompt` shares with `call`'s `prompt ++ response`.
fn shared_start(prompt: &[u32], call: &impl Call) -> usize {
    let own = call.prompt_ids();
    let in_prompt = common_prefix_len(prompt, &own);
    if in_prompt < own.len() {
        return in_prompt;
    }
    in_prompt + common_prefix_len(&prompt[in_prompt..], call.response_ids())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::call::{AGENT_TAG, Choice};
    use crate::test_calls::{TestCall, call};

    fn agent(mut c: TestCall, name: &str) -> TestCall {
        c.tags.push((AGENT_TAG.into(), name.into()));
        c
    }

    fn link(extends: usize, shared: usize) -> Link {
        Link {
            extends: Some(extends),
            shared,
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
            vec![Link::default(), link(0, 3), link(1, 5)]
        );
    }

    #[test]
    fn a_broken_prompt_says_where_it_first_differs() {
        // The second prompt re-renders the first response (3 -> 9).
        let calls = vec![call(0, &[1, 2], &[3, 4]), call(1, &[1, 2, 9, 4, 5], &[6])];
        assert_eq!(prompt_links(&calls)[1], link(0, 2));
        // Nothing shared: no link.
        let calls = vec![call(0, &[1, 2], &[3]), call(1, &[7, 8], &[9])];
        assert_eq!(prompt_links(&calls)[1], Link::default());
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
        let choice = |c: TestCall, index| TestCall {
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

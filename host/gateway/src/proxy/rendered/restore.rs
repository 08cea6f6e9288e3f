//! After a gateway restart, a live attempt's chains are rebuilt from its
//! recorded calls (the store is the source of truth): each successful call
//! (Chat Completions, Messages or Responses) becomes the leaf it was,
//! replacing the call it continued; the choices of an `n` > 1 call (next to
//! each other in the store) are served together, as they were.

use agl_conversation::{Chains, Served};
use agl_store::{MAX_PAGE, MODEL_REQUEST, Store, StoreError};
use agl_wire::record::{CallStatus, ModelRequest};

use crate::proxy::front::{self, Earlier};

/// The chains of rollout `rollout_id`'s attempt `attempt`, from the store.
pub async fn chains_from_store(
    store: &Store,
    rollout_id: &str,
    attempt: u32,
) -> Result<Chains, StoreError> {
    let calls = attempt_calls(store, rollout_id, attempt).await?;
    let earlier = Earlier::of(&calls);
    let mut chains = Chains::default();
    let mut rest = &calls[..];
    while let Some((_, first)) = rest.first() {
        let siblings = 1 + rest[1..]
            .iter()
            .zip(1..)
            .take_while(|((_, c), i)| sibling(first, c, *i))
            .count();
        let (group, later) = rest.split_at(siblings);
        let served = group
            .iter()
            .filter_map(|(seq, call)| served_of(*seq, call, &earlier))
            .collect();
        chains.served_choices(served, first.continues);
        rest = later;
    }
    Ok(chains)
}

/// Whether `call` is choice `index` of the request whose choice 0 is `first`.
fn sibling(first: &ModelRequest, call: &ModelRequest, index: u32) -> bool {
    match (first.choice, call.choice) {
        (Some(a), Some(b)) => a.index == 0 && b.index == index && b.count == a.count,
        _ => false,
    }
}

/// The attempt's recorded calls (those no retry superseded), in order,
/// with their store seqs.
pub async fn attempt_calls(
    store: &Store,
    rollout_id: &str,
    attempt: u32,
) -> Result<Vec<(u64, ModelRequest)>, StoreError> {
    let mut calls = Vec::new();
    let mut after = 0;
    loop {
        let page = store.list_events(rollout_id, after, MAX_PAGE).await?;
        let Some(last) = page.last() else {
            return Ok(calls);
        };
        after = last.seq;
        for ev in &page {
            if ev.attempt != attempt || ev.kind != MODEL_REQUEST || ev.superseded_by.is_some() {
                continue;
            }
            if let Ok(call) = serde_json::from_str::<ModelRequest>(ev.payload.as_str()) {
                calls.push((ev.seq, call));
            }
        }
    }
}

/// A recorded call as the leaf it was when served, whichever front-end
/// served it; `None` for calls that cannot be continued (failed, raw
/// completions, no tokens).
fn served_of(seq: u64, call: &ModelRequest, earlier: &Earlier) -> Option<Served> {
    if call.status != CallStatus::Ok || call.response_ids.is_empty() {
        return None;
    }
    let request = call.request.parse().ok()?;
    let response = call.response.parse().ok()?;
    let (conversation, reply) = front::of(call.api).read_back(request, &response, earlier)?;
    Some(Served {
        call: seq,
        messages: conversation.messages,
        tools: conversation.tools,
        prompt_ids: call.prompt_ids.clone(),
        response_ids: call.response_ids.clone(),
        reply,
    })
}

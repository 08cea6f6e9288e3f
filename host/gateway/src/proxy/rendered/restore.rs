//! After a gateway restart, a live attempt's chains are rebuilt from its
//! recorded calls (the store is the source of truth): each successful chat
//! call becomes the leaf it was, replacing the call it continued.

use agl_conversation::{Chains, Served, openai_chat};
use agl_store::{MAX_PAGE, MODEL_REQUEST, Store, StoreError};
use agl_wire::record::{CallStatus, ModelRequest};
use agl_wire::rollout::ApiKind;

/// The chains of rollout `rollout_id`'s attempt `attempt`, from the store.
pub async fn chains_from_store(
    store: &Store,
    rollout_id: &str,
    attempt: u32,
) -> Result<Chains, StoreError> {
    let mut chains = Chains::default();
    let mut after = 0;
    loop {
        let page = store.list_events(rollout_id, after, MAX_PAGE).await?;
        let Some(last) = page.last() else {
            return Ok(chains);
        };
        after = last.seq;
        for ev in &page {
            if ev.attempt != attempt || ev.kind != MODEL_REQUEST || ev.superseded_by.is_some() {
                continue;
            }
            let Ok(call) = serde_json::from_str::<ModelRequest>(ev.payload.as_str()) else {
                continue;
            };
            if let Some(served) = served_of(ev.seq, &call) {
                chains.served(served, call.continues);
            }
        }
    }
}

/// A recorded chat call as the leaf it was when served; `None` for calls
/// that cannot be continued (failed, not chat, no tokens).
fn served_of(seq: u64, call: &ModelRequest) -> Option<Served> {
    if call.status != CallStatus::Ok
        || call.api != ApiKind::ChatCompletions
        || call.response_ids.is_empty()
    {
        return None;
    }
    let conversation = openai_chat::conversation(&call.request.parse().ok()?).ok()?;
    let response = call.response.parse().ok()?;
    let reply = openai_chat::assistant_turn(response.pointer("/choices/0/message")?).ok()?;
    Some(Served {
        call: seq,
        messages: conversation.messages,
        tools: conversation.tools,
        prompt_ids: call.prompt_ids.clone(),
        response_ids: call.response_ids.clone(),
        reply,
    })
}

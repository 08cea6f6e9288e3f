//! Token-exact continuation. Per rollout attempt the gateway keeps the
//! token sequences it served; a request whose conversation extends one of
//! them (its earlier messages equal that call's, its next message is the
//! assistant turn the gateway returned, compared on the parsed form, and
//! something new follows) gets the earlier prompt ids + the sampled
//! response ids + the tokens of only the new messages. Anything else (a
//! summary, a truncation, a sub-agent's own history) is rendered fresh and
//! starts a new chain.
//!
//! Only the newest call of each chain is kept with the call it continued
//! (a continuation replaces that call as the chain's end; keeping it one
//! step back lets the same turn be asked again, e.g. a streamed repeat or
//! a second sample, and still continue), and at most [`MAX_CHAINS`] chains
//! per attempt, so memory stays bounded by the attempt's longest
//! sequences. The choices of an `n` > 1 call each end a chain (the next
//! call continues the one the harness kept) and count as one chain.

use std::sync::Arc;

use serde_json::Value;

use crate::ConversationError;
use crate::message::{AssistantTurn, Conversation, Message};
use crate::render::Renderer;

/// Chains kept per rollout attempt (a harness with sub-agents interleaves
/// a few); the least recently extended is dropped beyond it.
pub const MAX_CHAINS: usize = 8;

/// One call the gateway served, as the next call may extend it.
#[derive(Debug, Clone)]
pub struct Served {
    /// The call's id in the store (the `model_request` event seq).
    pub call: u64,
    pub messages: Vec<Message>,
    pub tools: Option<Value>,
    pub prompt_ids: Vec<u32>,
    pub response_ids: Vec<u32>,
    /// The reply as the gateway returned it (parsed).
    pub reply: AssistantTurn,
}

/// How to prompt a call.
#[derive(Debug, Clone, PartialEq)]
pub struct Prompt {
    pub ids: Vec<u32>,
    /// The call this one continues (its prompt + response are a prefix of
    /// `ids`), or `None` for a fresh render: a new chain.
    pub continues: Option<u64>,
}

/// The chains of one rollout attempt, newest first.
#[derive(Debug, Default, Clone)]
pub struct Chains {
    leaves: Vec<Leaf>,
}

/// A chain's last call and the one it continued (shared by the choices
/// of one call).
#[derive(Debug, Clone)]
struct Leaf {
    end: Served,
    before: Option<Arc<Served>>,
    /// The call whose choices these are: the first choice's id (its own
    /// for a call of one choice).
    group: u64,
}

impl Chains {
    /// The prompt for `conv`: continued from a chain it extends, else fresh.
    pub fn prompt(
        &self,
        renderer: &Renderer,
        conv: &Conversation,
    ) -> Result<Prompt, ConversationError> {
        match self.continued(renderer, conv)? {
            Some(prompt) => Ok(prompt),
            None => Ok(Prompt {
                ids: renderer.fresh(conv)?,
                continues: None,
            }),
        }
    }

    /// The prompt for `conv` when it extends one of the chains; `None`
    /// when it needs a fresh render. Renders only the new messages, so it
    /// is cheap where a fresh render of a long history is not.
    pub fn continued(
        &self,
        renderer: &Renderer,
        conv: &Conversation,
    ) -> Result<Option<Prompt>, ConversationError> {
        let candidates = self
            .leaves
            .iter()
            .flat_map(|l| std::iter::once(&l.end).chain(l.before.as_deref()));
        for served in candidates {
            if let Some(ids) = continue_from(renderer, served, conv)? {
                return Ok(Some(Prompt {
                    ids,
                    continues: Some(served.call),
                }));
            }
        }
        Ok(None)
    }

    /// Records a served call; it ends the chain of the call it continued,
    /// which it keeps one step back.
    pub fn served(&mut self, call: Served, continued: Option<u64>) {
        self.served_choices(vec![call], continued);
    }

    /// Records the choices of one served call (same prompt, one [`Served`]
    /// each, in choice order): each ends a chain of its own that continued
    /// `continued`; together they count as one chain against
    /// [`MAX_CHAINS`].
    pub fn served_choices(&mut self, choices: Vec<Served>, continued: Option<u64>) {
        let Some(group) = choices.first().map(|c| c.call) else {
            return;
        };
        let mut before = None;
        if let Some(prev) = continued {
            if let Some(i) = self.leaves.iter().position(|l| l.end.call == prev) {
                before = Some(Arc::new(self.leaves.remove(i).end));
            } else if let Some(l) = self
                .leaves
                .iter()
                .find(|l| l.before.as_ref().is_some_and(|b| b.call == prev))
            {
                // A second continuation of the same call: a branch.
                before = l.before.clone();
            }
        }
        for end in choices.into_iter().rev() {
            let before = before.clone();
            self.leaves.insert(0, Leaf { end, before, group });
        }
        // The newest MAX_CHAINS groups stay.
        let mut groups = Vec::with_capacity(MAX_CHAINS);
        self.leaves.retain(|l| {
            if !groups.contains(&l.group) {
                if groups.len() == MAX_CHAINS {
                    return false;
                }
                groups.push(l.group);
            }
            true
        });
    }

    pub fn len(&self) -> usize {
        self.leaves.len()
    }

    pub fn is_empty(&self) -> bool {
        self.leaves.is_empty()
    }
}

/// The continued prompt when `conv` extends `leaf`.
fn continue_from(
    renderer: &Renderer,
    leaf: &Served,
    conv: &Conversation,
) -> Result<Option<Vec<u32>>, ConversationError> {
    let n = leaf.messages.len();
    if conv.tools != leaf.tools || conv.messages.len() < n + 2 {
        return Ok(None);
    }
    let earlier_same = conv.messages[..n]
        .iter()
        .zip(&leaf.messages)
        .all(|(a, b)| a.same_as(b));
    let reply_same = matches!(&conv.messages[n], Message::Assistant(t) if t.same_as(&leaf.reply));
    if !earlier_same || !reply_same {
        return Ok(None);
    }
    let sampled_end = leaf
        .response_ids
        .last()
        .and_then(|&id| renderer.tokenizer().decode(&[id], false).ok())
        .unwrap_or_default();
    let Some(appended) =
        renderer.appended(&conv.messages[n + 1..], conv.tools.as_ref(), &sampled_end)?
    else {
        return Ok(None);
    };
    let mut ids =
        Vec::with_capacity(leaf.prompt_ids.len() + leaf.response_ids.len() + appended.len());
    ids.extend_from_slice(&leaf.prompt_ids);
    ids.extend_from_slice(&leaf.response_ids);
    ids.extend(appended);
    Ok(Some(ids))
}

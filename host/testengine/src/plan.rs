//! Turns a reply into the sequence of pieces both the plain and the streamed
//! response are built from, so the two always agree.

use super::script::{Reply, TOOL_CALL_CLOSE, tool_call_open};
use super::tokens::Codec;

/// Argument fragments are this many characters, like real engines' small deltas.
const ARG_FRAGMENT_CHARS: usize = 8;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    Stop,
    ToolCalls,
    Length,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stop => "stop",
            Self::ToolCalls => "tool_calls",
            Self::Length => "length",
        }
    }
}

/// What one piece adds to the message.
#[derive(Debug, Clone, PartialEq)]
pub enum Delta {
    Content(String),
    ToolStart {
        index: usize,
        id: String,
        name: String,
    },
    ToolArgs {
        index: usize,
        arguments: String,
    },
}

/// A delta and the token ids sampled for it.
#[derive(Debug, Clone)]
pub struct Piece {
    pub delta: Delta,
    pub ids: Vec<u32>,
}

#[derive(Debug, Clone)]
pub struct Plan {
    pub pieces: Vec<Piece>,
    pub finish: FinishReason,
}

/// An assembled tool call.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedCall {
    pub id: String,
    pub name: String,
    pub arguments: String,
}

impl Plan {
    /// Plans `reply`, truncated to `max_tokens` ids when given.
    /// `chunk_chars` is how many characters of content go in one piece.
    pub fn new(
        reply: &Reply,
        max_tokens: Option<usize>,
        chunk_chars: usize,
        codec: &Codec,
    ) -> Self {
        let encode = |t: &str| codec.encode(t);
        let sampled = encode(&reply.sampled_text());
        if let Some(max) = max_tokens.filter(|&m| m < sampled.len()) {
            // Cut mid tool call: a real tool parser fails and returns raw text.
            let pieces = content_pieces(&codec.decode(&sampled[..max]), chunk_chars, codec);
            return Self {
                pieces,
                finish: FinishReason::Length,
            };
        }
        let mut pieces = content_pieces(&reply.content, chunk_chars, codec);
        for (index, call) in reply.tool_calls.iter().enumerate() {
            let id = call.id.clone().unwrap_or_else(|| format!("call_{index}"));
            pieces.push(Piece {
                delta: Delta::ToolStart {
                    index,
                    id,
                    name: call.name.clone(),
                },
                ids: encode(&tool_call_open(&call.name)),
            });
            let mut frags = fragments(&call.arguments, ARG_FRAGMENT_CHARS);
            if frags.is_empty() {
                frags.push(String::new());
            }
            let last = frags.len() - 1;
            for (i, arguments) in frags.into_iter().enumerate() {
                let mut ids = encode(&arguments);
                if i == last {
                    ids.extend(encode(TOOL_CALL_CLOSE));
                }
                pieces.push(Piece {
                    delta: Delta::ToolArgs { index, arguments },
                    ids,
                });
            }
        }
        let finish = if reply.tool_calls.is_empty() {
            FinishReason::Stop
        } else {
            FinishReason::ToolCalls
        };
        Self { pieces, finish }
    }

    /// All sampled ids in order.
    pub fn ids(&self) -> Vec<u32> {
        self.pieces.iter().flat_map(|p| p.ids.clone()).collect()
    }

    pub fn content(&self) -> String {
        self.pieces
            .iter()
            .filter_map(|p| match &p.delta {
                Delta::Content(text) => Some(text.as_str()),
                _ => None,
            })
            .collect()
    }

    pub fn tool_calls(&self) -> Vec<PlannedCall> {
        let mut calls: Vec<PlannedCall> = Vec::new();
        for piece in &self.pieces {
            match &piece.delta {
                Delta::ToolStart { id, name, .. } => calls.push(PlannedCall {
                    id: id.clone(),
                    name: name.clone(),
                    arguments: String::new(),
                }),
                Delta::ToolArgs { index, arguments } => {
                    if let Some(call) = calls.get_mut(*index) {
                        call.arguments.push_str(arguments);
                    }
                }
                Delta::Content(_) => {}
            }
        }
        calls
    }
}

/// Content pieces of `chunk_chars` characters each, each encoded alone.
fn content_pieces(text: &str, chunk_chars: usize, codec: &Codec) -> Vec<Piece> {
    fragments(text, chunk_chars)
        .into_iter()
        .map(|chunk| Piece {
            ids: codec.encode(&chunk),
            delta: Delta::Content(chunk),
        })
        .collect()
}

/// Splits on character boundaries into runs of at most `n` characters.
fn fragments(text: &str, n: usize) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    chars.chunks(n.max(1)).map(|c| c.iter().collect()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_call_ids_cover_sampled_text() {
        let reply = Reply::text("ok").with_tool_call("bash", r#"{"command": "ls -la"}"#);
        let plan = Plan::new(&reply, None, 1, &Codec::default());
        assert_eq!(plan.ids(), crate::tokens::encode(&reply.sampled_text()));
        assert_eq!(plan.finish, FinishReason::ToolCalls);
        let calls = plan.tool_calls();
        assert_eq!(calls[0].arguments, r#"{"command": "ls -la"}"#);
        assert_eq!(calls[0].id, "call_0");
    }

    #[test]
    fn truncation_drops_tool_calls() {
        let reply = Reply::text("ab").with_tool_call("f", "{}");
        let plan = Plan::new(&reply, Some(5), 2, &Codec::default());
        assert_eq!(plan.finish, FinishReason::Length);
        assert_eq!(plan.content(), "ab<to");
        assert!(plan.tool_calls().is_empty());
        assert_eq!(plan.ids().len(), 5);
    }
}

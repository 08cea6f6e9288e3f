//! How a rollout's model calls become training samples, written once: the
//! host runs it for every plugin (`agl:adapter/samples` in `wit/agl.wit`,
//! so a Rust and a Python adapter merge alike), and the Rust guest SDK
//! compiles the same code for what a plugin asks of single calls.
//!
//! - [`links`]: which earlier call a prompt extends (`model-call.prompt`);
//! - [`builder`]: one chain of calls as one sample;
//! - [`merge`]: a rollout's calls as few samples as the ids allow, one
//!   chain per agent;
//! - [`breaks`]: why a call did not continue its chain;
//! - [`messages`], [`call`]: reading and comparing the calls' JSON.
//!
//! It knows calls through the [`Call`] trait: the host's records, the
//! guest's (whose JSON and whole prompts it fetches on demand) and test
//! calls all implement it.

pub mod breaks;
pub mod builder;
pub mod call;
pub mod links;
pub mod merge;
pub mod messages;
pub mod prefix;

pub use breaks::{Divergence, classify_break, marked_summary};
pub use builder::{NotAContinuation, SampleBuilder};
pub use call::{AGENT_TAG, Api, Call, Choice, Decoder, PromptLink};
pub use merge::{MergeOptions, Merged, merge};
pub use prefix::{common_prefix_len, starts_with_ids};

/// A half-open range `[start, end)` of response positions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    pub start: u32,
    pub end: u32,
}

/// Why a chain of merged calls ended (`break-kind` in `wit/agl.wit`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakKind {
    Retokenize,
    Template,
    Other,
    Summary,
    SubAgent,
}

impl BreakKind {
    /// The WIT name: `retokenize`, `template`, `other`, `summary`,
    /// `sub-agent`.
    pub fn name(self) -> &'static str {
        match self {
            BreakKind::Retokenize => "retokenize",
            BreakKind::Template => "template",
            BreakKind::Other => "other",
            BreakKind::Summary => "summary",
            BreakKind::SubAgent => "sub-agent",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainBreak {
    pub kind: BreakKind,
    /// The call whose prompt did not continue the chain.
    pub call_index: u32,
    pub detail: String,
}

/// One training sequence (`sample` in `wit/agl.wit`).
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub prompt_ids: Vec<u32>,
    pub response_ids: Vec<u32>,
    pub trainable: Vec<Span>,
    pub logprobs: Vec<f32>,
    pub source_calls: Vec<u32>,
    pub weight_version: u64,
    pub agent: Option<String>,
    pub break_before: Option<ChainBreak>,
}

#[cfg(test)]
mod test_calls;

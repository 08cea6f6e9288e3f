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
#[cfg_attr(
    feature = "wire",
    derive(serde::Serialize, serde::Deserialize, utoipa::ToSchema)
)]
pub struct Span {
    pub start: u32,
    pub end: u32,
}

/// Why a chain of merged calls ended (`break-kind` in `wit/agl.wit`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(
    feature = "wire",
    derive(serde::Serialize, serde::Deserialize, utoipa::ToSchema),
    serde(rename_all = "snake_case")
)]
pub enum BreakKind {
    Retokenize,
    Template,
    Other,
    /// The history's middle was replaced (a summary, compaction).
    Summary,
    /// Another agent's conversation.
    #[cfg_attr(feature = "wire", serde(rename = "sub-agent"))]
    SubAgent,
}

impl BreakKind {
    pub const ALL: [BreakKind; 5] = [
        BreakKind::Retokenize,
        BreakKind::Template,
        BreakKind::Summary,
        BreakKind::SubAgent,
        BreakKind::Other,
    ];

    /// The WIT name (`retokenize`, `template`, `other`, `summary`,
    /// `sub-agent`), also the JSONL one.
    pub fn as_str(self) -> &'static str {
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
#[cfg_attr(
    feature = "wire",
    derive(serde::Serialize, serde::Deserialize, utoipa::ToSchema)
)]
pub struct ChainBreak {
    pub kind: BreakKind,
    /// The call whose prompt did not continue the chain.
    pub call_index: u32,
    pub detail: String,
}

/// One training sequence (`sample` in `wit/agl.wit`), as a sample adapter
/// builds it (and the host validates it).
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "wire", derive(serde::Serialize, serde::Deserialize))]
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

/// Moves a sample into another type of the same fields (`sample` of
/// `wit/agl.wit`: these, a guest's or the host's bindings), its spans and
/// break into `$span` and `$chain_break`, each break kind through `$kind`.
#[macro_export]
macro_rules! convert_sample {
    // Paths as `ident`s: a `path` fragment cannot name a struct literal.
    ($s:expr => $($sample:ident)::+, $($span:ident)::+, $($chain_break:ident)::+, $kind:expr) => {{
        let s = $s;
        $($sample)::+ {
            prompt_ids: s.prompt_ids,
            response_ids: s.response_ids,
            trainable: s
                .trainable
                .into_iter()
                .map(|t| $($span)::+ {
                    start: t.start,
                    end: t.end,
                })
                .collect(),
            logprobs: s.logprobs,
            source_calls: s.source_calls,
            weight_version: s.weight_version,
            agent: s.agent,
            break_before: s.break_before.map(|b| $($chain_break)::+ {
                kind: ($kind)(b.kind),
                call_index: b.call_index,
                detail: b.detail,
            }),
        }
    }};
}

impl Sample {
    /// Number of response tokens that are trained.
    pub fn trainable_tokens(&self) -> usize {
        self.trainable
            .iter()
            .map(|s| (s.end - s.start) as usize)
            .sum()
    }

    /// The response in order as runs of trained (`true`) and masked
    /// positions (spans are sorted and disjoint, as the host validates).
    pub fn runs(&self) -> Vec<(bool, std::ops::Range<usize>)> {
        let len = self.response_ids.len();
        let mut out = Vec::new();
        let mut at = 0usize;
        for span in &self.trainable {
            let (start, end) = ((span.start as usize).min(len), (span.end as usize).min(len));
            if start > at {
                out.push((false, at..start));
            }
            if end > start {
                out.push((true, start..end));
            }
            at = at.max(end);
        }
        if at < len {
            out.push((false, at..len));
        }
        out
    }
}

#[cfg(test)]
mod test_calls;

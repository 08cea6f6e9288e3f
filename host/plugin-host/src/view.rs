//! A rollout as the guest sees it, borrowed from agl's record: wasmtime
//! lowers it straight into guest memory, so what a rollout hands over is
//! copied once, not first into owned WIT values. The call record is the one
//! part that differs between the `agl:adapter` versions the host serves:
//! from 0.5 it holds what each prompt adds to an earlier call's
//! (`agl_samples::links`) and no JSON; before, every whole prompt and body.
//! Each frozen version's `model-call` is generated from its field list
//! ([`call_view!`]): a field is named, typed and read from the record once.

use wasmtime::component::{ComponentType, Lower};

use super::bindings::wit;
use agl_samples::links::Link;
use agl_wire::rollout;

/// `rollout` of any served version; `C` is that version's `model-call`.
#[derive(ComponentType, Lower)]
#[component(record)]
pub(crate) struct RolloutView<'a, C> {
    id: &'a str,
    #[component(name = "group-id")]
    group_id: &'a str,
    attempt: u32,
    #[component(name = "input-json")]
    input_json: &'a str,
    status: wit::RolloutStatus,
    calls: Vec<C>,
    events: Vec<EventView<'a>>,
}

/// A version's `model-call` record, borrowed from agl's: `$view` holds the
/// listed fields, in the WIT's order, each typed, named and read from the
/// record `call` as its rule below says (one rule per field of any
/// version: a new frozen version is one more invocation).
macro_rules! call_view {
    ($(#[$doc:meta])* $view:ident { $($field:ident),* $(,)? }) => {
        call_view!(@munch [$(#[$doc])* $view] [] [] $($field)*);
    };
    (@munch [$(#[$doc:meta])* $view:ident] [$($decl:tt)*] [$($field:ident: $read:expr,)*]) => {
        $(#[$doc])*
        #[derive(ComponentType, Lower)]
        #[component(record)]
        pub(crate) struct $view<'a> { $($decl)* }

        impl<'a> From<&'a rollout::ModelCall> for $view<'a> {
            fn from(call: &'a rollout::ModelCall) -> Self {
                Self { $($field: ($read)(call),)* }
            }
        }
    };
    (@munch $head:tt [$($decl:tt)*] [$($init:tt)*] $field:ident $($rest:ident)*) => {
        call_view!(@field $field, $head [$($decl)*] [$($init)*] $($rest)*);
    };
    // Each field: its WIT name (where it is not the Rust one), type, read.
    (@field index, $($t:tt)*) => { call_view!(@add index "index": u32 = |call| call.index, $($t)*); };
    (@field api, $($t:tt)*) => { call_view!(@add api "api": wit::ApiKind = |call| call.api.into(), $($t)*); };
    (@field request_json, $($t:tt)*) => {
        call_view!(@add request_json "request-json": &'a str = |call| call.request.as_str(), $($t)*);
    };
    (@field response_json, $($t:tt)*) => {
        call_view!(@add response_json "response-json": &'a str = |call| call.response.as_str(), $($t)*);
    };
    (@field prompt_ids, $($t:tt)*) => {
        call_view!(@add prompt_ids "prompt-ids": &'a [u32] = |call| &call.prompt_ids, $($t)*);
    };
    (@field response_ids, $($t:tt)*) => {
        call_view!(@add response_ids "response-ids": &'a [u32] = |call| &call.response_ids, $($t)*);
    };
    (@field response_logprobs, $($t:tt)*) => {
        call_view!(@add response_logprobs "response-logprobs": &'a [f32] = |call| &call.response_logprobs, $($t)*);
    };
    (@field weight_version, $($t:tt)*) => {
        call_view!(@add weight_version "weight-version": u64 = |call| call.weight_version, $($t)*);
    };
    (@field finish_reason, $($t:tt)*) => {
        call_view!(@add finish_reason "finish-reason": Option<&'a str> = |call| call.finish_reason.as_deref(), $($t)*);
    };
    (@field started_at_ms, $($t:tt)*) => {
        call_view!(@add started_at_ms "started-at-ms": u64 = |call| call.started_at_ms, $($t)*);
    };
    (@field finished_at_ms, $($t:tt)*) => {
        call_view!(@add finished_at_ms "finished-at-ms": u64 = |call| call.finished_at_ms, $($t)*);
    };
    (@field tags, $($t:tt)*) => { call_view!(@add tags "tags": Vec<TagView<'a>> = |call| tags(call), $($t)*); };
    (@field continues, $($t:tt)*) => {
        call_view!(@add continues "continues": Option<u32> = |call| call.continues, $($t)*);
    };
    (@field choice, $($t:tt)*) => {
        call_view!(@add choice "choice": Option<wit::CallChoice> = |call| call.choice.map(|c| wit::CallChoice {
            index: c.index,
            count: c.count,
        }), $($t)*);
    };
    (@field constrained, $($t:tt)*) => {
        call_view!(@add constrained "constrained": bool = |call| call.constrained, $($t)*);
    };
    (@field response_versions, $($t:tt)*) => {
        call_view!(@add response_versions "response-versions": Option<&'a [u64]> =
            |call| call.response_versions.as_deref(), $($t)*);
    };
    (@add $field:ident $wit:literal: $ty:ty = |$c:ident| $read:expr, $head:tt [$($decl:tt)*] [$($init:tt)*] $($rest:ident)*) => {
        call_view!(@munch $head
            [$($decl)* #[component(name = $wit)] $field: $ty,]
            [$($init)* $field: |$c: &'a rollout::ModelCall| $read,]
            $($rest)*);
    };
}

call_view!(
    /// `model-call` of 0.1 (frozen).
    ModelCallViewV0_1 {
        index, api, request_json, response_json, prompt_ids, response_ids, response_logprobs,
        weight_version, finish_reason, started_at_ms, finished_at_ms, tags,
    }
);
call_view!(
    /// `model-call` of 0.2 (frozen): 0.1's fields plus `continues`.
    ModelCallViewV0_2 {
        index, api, request_json, response_json, prompt_ids, response_ids, response_logprobs,
        weight_version, finish_reason, started_at_ms, finished_at_ms, tags, continues,
    }
);
call_view!(
    /// `model-call` of 0.3 (frozen): 0.2's fields plus `choice` and `constrained`.
    ModelCallViewV0_3 {
        index, api, request_json, response_json, prompt_ids, response_ids, response_logprobs,
        weight_version, finish_reason, started_at_ms, finished_at_ms, tags, continues, choice,
        constrained,
    }
);
call_view!(
    /// `model-call` of 0.4 (frozen): 0.3's fields plus `response-versions`.
    ModelCallViewV0_4 {
        index, api, request_json, response_json, prompt_ids, response_ids, response_logprobs,
        weight_version, finish_reason, started_at_ms, finished_at_ms, tags, continues, choice,
        constrained, response_versions,
    }
);

/// `model-call` of 0.5: 0.4's fields less the JSON, the prompt as a
/// [`PromptView`].
#[derive(ComponentType, Lower)]
#[component(record)]
pub(crate) struct ModelCallView<'a> {
    index: u32,
    api: wit::ApiKind,
    prompt: PromptView<'a>,
    #[component(name = "response-ids")]
    response_ids: &'a [u32],
    #[component(name = "response-logprobs")]
    response_logprobs: &'a [f32],
    #[component(name = "weight-version")]
    weight_version: u64,
    #[component(name = "finish-reason")]
    finish_reason: Option<&'a str>,
    #[component(name = "started-at-ms")]
    started_at_ms: u64,
    #[component(name = "finished-at-ms")]
    finished_at_ms: u64,
    tags: Vec<TagView<'a>>,
    continues: Option<u32>,
    choice: Option<wit::CallChoice>,
    constrained: bool,
    #[component(name = "response-versions")]
    response_versions: Option<&'a [u64]>,
}

/// `prompt` of 0.5: the ids after the start shared with call `extends`.
#[derive(ComponentType, Lower)]
#[component(record)]
pub(crate) struct PromptView<'a> {
    extends: Option<u32>,
    shared: u32,
    tail: &'a [u32],
}

#[derive(ComponentType, Lower)]
#[component(record)]
pub(crate) struct TagView<'a> {
    key: &'a str,
    value: &'a str,
}

#[derive(ComponentType, Lower)]
#[component(record)]
pub(crate) struct EventView<'a> {
    kind: &'a str,
    #[component(name = "payload-json")]
    payload_json: &'a str,
    #[component(name = "timestamp-ms")]
    timestamp_ms: u64,
}

/// A version's call records of a whole rollout.
pub(crate) trait CallsView<'a>: Sized {
    /// Whether the records hand each prompt over as its link.
    const LINKED: bool = false;
    /// The records; `links` are the prompts' (where [`Self::LINKED`]).
    fn of(r: &'a rollout::Rollout, links: &[Link]) -> Vec<Self>;
}

/// Before 0.5 each call's record is its own.
macro_rules! calls_one_by_one {
    ($($view:ident),*) => {
        $(impl<'a> CallsView<'a> for $view<'a> {
            fn of(r: &'a rollout::Rollout, _: &[Link]) -> Vec<Self> {
                r.calls.iter().map(Self::from).collect()
            }
        })*
    };
}

calls_one_by_one!(
    ModelCallViewV0_4,
    ModelCallViewV0_3,
    ModelCallViewV0_2,
    ModelCallViewV0_1
);

impl<'a> CallsView<'a> for ModelCallView<'a> {
    const LINKED: bool = true;

    fn of(r: &'a rollout::Rollout, links: &[Link]) -> Vec<Self> {
        r.calls
            .iter()
            .zip(links.iter().copied())
            .map(|(call, link)| {
                let old = ModelCallViewV0_4::from(call);
                Self {
                    index: call.index,
                    api: old.api,
                    prompt: PromptView {
                        extends: link.extends.map(|at| r.calls[at].index),
                        shared: link.shared as u32,
                        tail: &call.prompt_ids[link.shared..],
                    },
                    response_ids: old.response_ids,
                    response_logprobs: old.response_logprobs,
                    weight_version: old.weight_version,
                    finish_reason: old.finish_reason,
                    started_at_ms: old.started_at_ms,
                    finished_at_ms: old.finished_at_ms,
                    tags: old.tags,
                    continues: old.continues,
                    choice: old.choice,
                    constrained: old.constrained,
                    response_versions: old.response_versions,
                }
            })
            .collect()
    }
}

impl<'a, C: CallsView<'a>> RolloutView<'a, C> {
    pub(crate) fn new(r: &'a rollout::Rollout, links: &[Link]) -> Self {
        Self {
            id: &r.id,
            group_id: &r.group_id,
            attempt: r.attempt,
            input_json: r.input.as_str(),
            status: r.status.into(),
            calls: C::of(r, links),
            events: r
                .events
                .iter()
                .map(|e| EventView {
                    kind: &e.kind,
                    payload_json: e.payload.as_str(),
                    timestamp_ms: e.timestamp_ms,
                })
                .collect(),
        }
    }
}

fn tags(call: &rollout::ModelCall) -> Vec<TagView<'_>> {
    call.tags
        .iter()
        .map(|(key, value)| TagView { key, value })
        .collect()
}

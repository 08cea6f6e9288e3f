//! A rollout as the guest sees it, borrowed from agl's record: wasmtime
//! lowers it straight into guest memory, so what a rollout hands over is
//! copied once, not first into owned WIT values. The call record is the one
//! part that differs between the `agl:adapter` versions the host serves:
//! from 0.5 it holds what each prompt adds to an earlier call's
//! ([`crate::links`]) and no JSON; before, every whole prompt and body.

use wasmtime::component::{ComponentType, Lower};

use super::bindings::wit;
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

/// `model-call` of 0.4 (frozen): 0.3's fields plus `response-versions`.
#[derive(ComponentType, Lower)]
#[component(record)]
pub(crate) struct ModelCallViewV0_4<'a> {
    index: u32,
    api: wit::ApiKind,
    #[component(name = "request-json")]
    request_json: &'a str,
    #[component(name = "response-json")]
    response_json: &'a str,
    #[component(name = "prompt-ids")]
    prompt_ids: &'a [u32],
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

/// `model-call` of 0.3 (frozen): 0.2's fields plus `choice` and `constrained`.
#[derive(ComponentType, Lower)]
#[component(record)]
pub(crate) struct ModelCallViewV0_3<'a> {
    index: u32,
    api: wit::ApiKind,
    #[component(name = "request-json")]
    request_json: &'a str,
    #[component(name = "response-json")]
    response_json: &'a str,
    #[component(name = "prompt-ids")]
    prompt_ids: &'a [u32],
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
}

/// `model-call` of 0.2 (frozen): 0.1's fields plus `continues`.
#[derive(ComponentType, Lower)]
#[component(record)]
pub(crate) struct ModelCallViewV0_2<'a> {
    index: u32,
    api: wit::ApiKind,
    #[component(name = "request-json")]
    request_json: &'a str,
    #[component(name = "response-json")]
    response_json: &'a str,
    #[component(name = "prompt-ids")]
    prompt_ids: &'a [u32],
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
}

/// `model-call` of 0.1 (frozen).
#[derive(ComponentType, Lower)]
#[component(record)]
pub(crate) struct ModelCallViewV0_1<'a> {
    index: u32,
    api: wit::ApiKind,
    #[component(name = "request-json")]
    request_json: &'a str,
    #[component(name = "response-json")]
    response_json: &'a str,
    #[component(name = "prompt-ids")]
    prompt_ids: &'a [u32],
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
    fn of(r: &'a rollout::Rollout) -> Vec<Self>;
}

/// Before 0.5 each call's record is its own.
macro_rules! calls_one_by_one {
    ($($view:ident),*) => {
        $(impl<'a> CallsView<'a> for $view<'a> {
            fn of(r: &'a rollout::Rollout) -> Vec<Self> {
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
    fn of(r: &'a rollout::Rollout) -> Vec<Self> {
        let links = crate::links::prompt_links(&r.calls);
        r.calls
            .iter()
            .zip(links)
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
    pub(crate) fn new(r: &'a rollout::Rollout) -> Self {
        Self {
            id: &r.id,
            group_id: &r.group_id,
            attempt: r.attempt,
            input_json: r.input.as_str(),
            status: r.status.into(),
            calls: C::of(r),
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

impl<'a> From<&'a rollout::ModelCall> for ModelCallViewV0_4<'a> {
    fn from(call: &'a rollout::ModelCall) -> Self {
        let old = ModelCallViewV0_3::from(call);
        Self {
            index: old.index,
            api: old.api,
            request_json: old.request_json,
            response_json: old.response_json,
            prompt_ids: old.prompt_ids,
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
            response_versions: call.response_versions.as_deref(),
        }
    }
}

impl<'a> From<&'a rollout::ModelCall> for ModelCallViewV0_3<'a> {
    fn from(call: &'a rollout::ModelCall) -> Self {
        let old = ModelCallViewV0_2::from(call);
        Self {
            index: old.index,
            api: old.api,
            request_json: old.request_json,
            response_json: old.response_json,
            prompt_ids: old.prompt_ids,
            response_ids: old.response_ids,
            response_logprobs: old.response_logprobs,
            weight_version: old.weight_version,
            finish_reason: old.finish_reason,
            started_at_ms: old.started_at_ms,
            finished_at_ms: old.finished_at_ms,
            tags: old.tags,
            continues: old.continues,
            choice: call.choice.map(|c| wit::CallChoice {
                index: c.index,
                count: c.count,
            }),
            constrained: call.constrained,
        }
    }
}

impl<'a> From<&'a rollout::ModelCall> for ModelCallViewV0_2<'a> {
    fn from(call: &'a rollout::ModelCall) -> Self {
        Self {
            index: call.index,
            api: call.api.into(),
            request_json: call.request.as_str(),
            response_json: call.response.as_str(),
            prompt_ids: &call.prompt_ids,
            response_ids: &call.response_ids,
            response_logprobs: &call.response_logprobs,
            weight_version: call.weight_version,
            finish_reason: call.finish_reason.as_deref(),
            started_at_ms: call.started_at_ms,
            finished_at_ms: call.finished_at_ms,
            tags: tags(call),
            continues: call.continues,
        }
    }
}

impl<'a> From<&'a rollout::ModelCall> for ModelCallViewV0_1<'a> {
    fn from(call: &'a rollout::ModelCall) -> Self {
        Self {
            index: call.index,
            api: call.api.into(),
            request_json: call.request.as_str(),
            response_json: call.response.as_str(),
            prompt_ids: &call.prompt_ids,
            response_ids: &call.response_ids,
            response_logprobs: &call.response_logprobs,
            weight_version: call.weight_version,
            finish_reason: call.finish_reason.as_deref(),
            started_at_ms: call.started_at_ms,
            finished_at_ms: call.finished_at_ms,
            tags: tags(call),
        }
    }
}

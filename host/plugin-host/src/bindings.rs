//! Host bindings of the two plugin worlds and conversions between the
//! generated WIT types and agl's own rollout types.

use wasmtime::component::{ComponentType, Lower};

use agl_wire::rollout;

/// World `sample-adapter`; it owns every `agl:adapter` interface.
pub(crate) mod sample {
    wasmtime::component::bindgen!({
        world: "sample-adapter",
        path: "../../wit",
        // Exports are called with `call_async` so that a deadline can cancel
        // a runaway guest (see `instance.rs`).
        exports: { default: async },
        additional_derives: [PartialEq],
    });
}

/// World `reward`, reusing `sample`'s interfaces so that one set of types
/// and one implementation of the imports serves both worlds.
pub(crate) mod reward {
    wasmtime::component::bindgen!({
        world: "reward",
        path: "../../wit",
        exports: { default: async },
        with: {
            "agl:adapter/types": super::sample::agl::adapter::types,
            "agl:adapter/log": super::sample::agl::adapter::log,
            "agl:adapter/config": super::sample::agl::adapter::config,
            "agl:adapter/tokenizer": super::sample::agl::adapter::tokenizer,
        },
    });
}

pub(crate) use sample::agl::adapter::types as wit;

impl From<rollout::ApiKind> for wit::ApiKind {
    fn from(api: rollout::ApiKind) -> Self {
        match api {
            rollout::ApiKind::ChatCompletions => Self::ChatCompletions,
            rollout::ApiKind::Completions => Self::Completions,
            rollout::ApiKind::Responses => Self::Responses,
            rollout::ApiKind::AnthropicMessages => Self::AnthropicMessages,
        }
    }
}

impl From<rollout::RolloutStatus> for wit::RolloutStatus {
    fn from(status: rollout::RolloutStatus) -> Self {
        match status {
            rollout::RolloutStatus::Queued => Self::Queued,
            rollout::RolloutStatus::Running => Self::Running,
            rollout::RolloutStatus::Succeeded => Self::Succeeded,
            rollout::RolloutStatus::Failed => Self::Failed,
            rollout::RolloutStatus::Cancelled => Self::Cancelled,
        }
    }
}

/// A rollout as the guest sees it, borrowed from agl's record: wasmtime lowers
/// it straight into guest memory, so the megabytes of ids and request JSON
/// of a long rollout are copied once, not first into owned WIT values.
#[derive(ComponentType, Lower)]
#[component(record)]
pub(crate) struct RolloutView<'a> {
    id: &'a str,
    #[component(name = "group-id")]
    group_id: &'a str,
    attempt: u32,
    #[component(name = "input-json")]
    input_json: &'a str,
    status: wit::RolloutStatus,
    calls: Vec<ModelCallView<'a>>,
    events: Vec<EventView<'a>>,
}

#[derive(ComponentType, Lower)]
#[component(record)]
pub(crate) struct ModelCallView<'a> {
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

impl<'a> RolloutView<'a> {
    pub(crate) fn new(r: &'a rollout::Rollout) -> Self {
        Self {
            id: &r.id,
            group_id: &r.group_id,
            attempt: r.attempt,
            input_json: r.input.as_str(),
            status: r.status.into(),
            calls: r.calls.iter().map(ModelCallView::new).collect(),
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

impl<'a> ModelCallView<'a> {
    fn new(call: &'a rollout::ModelCall) -> Self {
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
            tags: call
                .tags
                .iter()
                .map(|(key, value)| TagView { key, value })
                .collect(),
        }
    }
}

impl From<wit::BreakKind> for rollout::BreakKind {
    fn from(kind: wit::BreakKind) -> Self {
        match kind {
            wit::BreakKind::Retokenize => Self::Retokenize,
            wit::BreakKind::Template => Self::Template,
            wit::BreakKind::Other => Self::Other,
        }
    }
}

impl From<wit::Sample> for rollout::Sample {
    fn from(s: wit::Sample) -> Self {
        Self {
            prompt_ids: s.prompt_ids,
            response_ids: s.response_ids,
            trainable: s
                .trainable
                .into_iter()
                .map(|span| rollout::Span {
                    start: span.start,
                    end: span.end,
                })
                .collect(),
            logprobs: s.logprobs,
            source_calls: s.source_calls,
            weight_version: s.weight_version,
            agent: s.agent,
            break_before: s.break_before.map(|b| rollout::ChainBreak {
                kind: b.kind.into(),
                call_index: b.call_index,
                detail: b.detail,
            }),
        }
    }
}

impl From<wit::PluginInfo> for super::PluginInfo {
    fn from(info: wit::PluginInfo) -> Self {
        Self {
            name: info.name,
            version: info.version,
            description: info.description,
        }
    }
}

//! Host bindings of the two plugin worlds and conversions between the
//! generated WIT types and agl's own rollout types.

use crate::rollout;

/// World `sample-adapter`; it owns every `agl:adapter` interface.
pub(crate) mod sample {
    wasmtime::component::bindgen!({
        world: "sample-adapter",
        path: "../wit",
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
        path: "../wit",
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

impl From<&rollout::ModelCall> for wit::ModelCall {
    fn from(call: &rollout::ModelCall) -> Self {
        Self {
            index: call.index,
            api: call.api.into(),
            request_json: call.request.as_str().to_owned(),
            response_json: call.response.as_str().to_owned(),
            prompt_ids: call.prompt_ids.clone(),
            response_ids: call.response_ids.clone(),
            response_logprobs: call.response_logprobs.clone(),
            weight_version: call.weight_version,
            finish_reason: call.finish_reason.clone(),
            started_at_ms: call.started_at_ms,
            finished_at_ms: call.finished_at_ms,
            tags: call
                .tags
                .iter()
                .map(|(key, value)| wit::Tag {
                    key: key.clone(),
                    value: value.clone(),
                })
                .collect(),
        }
    }
}

impl From<&rollout::Event> for wit::Event {
    fn from(event: &rollout::Event) -> Self {
        Self {
            kind: event.kind.clone(),
            payload_json: event.payload.as_str().to_owned(),
            timestamp_ms: event.timestamp_ms,
        }
    }
}

impl From<&rollout::Rollout> for wit::Rollout {
    fn from(r: &rollout::Rollout) -> Self {
        Self {
            id: r.id.clone(),
            group_id: r.group_id.clone(),
            attempt: r.attempt,
            input_json: r.input.as_str().to_owned(),
            status: r.status.into(),
            calls: r.calls.iter().map(Into::into).collect(),
            events: r.events.iter().map(Into::into).collect(),
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

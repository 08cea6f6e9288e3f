//! Host bindings of the two plugin worlds and conversions between the
//! generated WIT types and agl's own rollout types.

use agl_wire::rollout;

/// The bindings of one `agl:adapter` version: world `sample-adapter` owns
/// every interface, world `reward` reuses them through `with`, so one set
/// of types and one implementation of the imports serves both worlds.
macro_rules! worlds {
    ($path:literal $(, $iface:literal => $module:ident)*) => {
        pub(crate) mod sample {
            wasmtime::component::bindgen!({
                world: "sample-adapter",
                path: $path,
                // Exports are called with `call_async` so that a deadline
                // can cancel a runaway guest (see `instance.rs`).
                exports: { default: async },
                additional_derives: [PartialEq],
            });
        }

        pub(crate) mod reward {
            wasmtime::component::bindgen!({
                world: "reward",
                path: $path,
                exports: { default: async },
                with: {
                    "agl:adapter/types": super::sample::agl::adapter::types,
                    "agl:adapter/log": super::sample::agl::adapter::log,
                    "agl:adapter/config": super::sample::agl::adapter::config,
                    "agl:adapter/tokenizer": super::sample::agl::adapter::tokenizer,
                    $($iface: super::sample::agl::adapter::$module,)*
                },
            });
        }

        pub(crate) use sample::agl::adapter::types as wit;
    };
}

/// `agl:adapter@0.6.0` (`wit/agl.wit`), the current contract.
pub(crate) mod v0_6 {
    worlds!("../../wit", "agl:adapter/rollout-data" => rollout_data);
}

/// `agl:adapter@0.5.0` (`wit/v0.5/agl.wit`, frozen), for plugins built
/// before 0.6: no `samples` import (they merge in the guest).
pub(crate) mod v0_5 {
    worlds!("../../wit/v0.5", "agl:adapter/rollout-data" => rollout_data);
}

/// `agl:adapter@0.4.0` (`wit/v0.4/agl.wit`, frozen), for plugins built
/// before 0.5: every call's request and response JSON and whole prompt ids
/// in the record.
pub(crate) mod v0_4 {
    worlds!("../../wit/v0.4");
}

/// `agl:adapter@0.3.0` (`wit/v0.3/agl.wit`, frozen), for plugins built
/// before 0.4: no `model-call.response-versions`.
pub(crate) mod v0_3 {
    worlds!("../../wit/v0.3");
}

/// `agl:adapter@0.2.0` (`wit/v0.2/agl.wit`, frozen), for plugins built
/// before 0.3: no `model-call.choice` or `model-call.constrained`.
pub(crate) mod v0_2 {
    worlds!("../../wit/v0.2");
}

/// `agl:adapter@0.1.0` (`wit/v0.1/agl.wit`, frozen), for plugins built
/// before 0.2: no `model-call.continues`, three break kinds.
pub(crate) mod v0_1 {
    worlds!("../../wit/v0.1");
}

pub(crate) use v0_6::wit;

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

/// A guest's results, converted into agl's types; one impl per version.
macro_rules! from_guest {
    ($v:ident { $($case:ident),* }) => {
        impl From<$v::wit::BreakKind> for rollout::BreakKind {
            fn from(kind: $v::wit::BreakKind) -> Self {
                match kind {
                    $($v::wit::BreakKind::$case => Self::$case,)*
                }
            }
        }

        impl From<$v::wit::Sample> for rollout::Sample {
            fn from(s: $v::wit::Sample) -> Self {
                agl_samples::convert_sample!(
                    s => rollout::Sample, rollout::Span, rollout::ChainBreak, rollout::BreakKind::from
                )
            }
        }
    };
}

from_guest!(v0_6 {
    Retokenize,
    Template,
    Other,
    Summary,
    SubAgent
});
from_guest!(v0_5 {
    Retokenize,
    Template,
    Other,
    Summary,
    SubAgent
});
from_guest!(v0_4 {
    Retokenize,
    Template,
    Other,
    Summary,
    SubAgent
});
from_guest!(v0_3 {
    Retokenize,
    Template,
    Other,
    Summary,
    SubAgent
});
from_guest!(v0_2 {
    Retokenize,
    Template,
    Other,
    Summary,
    SubAgent
});
from_guest!(v0_1 {
    Retokenize,
    Template,
    Other
});

impl From<wit::PluginInfo> for super::PluginInfo {
    fn from(info: wit::PluginInfo) -> Self {
        Self {
            name: info.name,
            version: info.version,
            description: info.description,
        }
    }
}

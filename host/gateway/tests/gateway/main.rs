//! The gateway: management API, proxy, SDK and curl clients, load.
//! One test binary for the crate (each links the whole dependency tree).

mod anthropic_sdk;
mod api;
mod claude_code;
mod codex;
mod curl;
mod harness;
mod hostile;
mod load;
mod openai_sdk;
mod openapi;
mod opencode;
#[path = "../../../../tests/support/policy.rs"]
mod policy;
#[allow(dead_code)]
#[path = "../../../../tests/support/process.rs"]
mod process;
mod proxy;
mod rendered;
mod rendered_limits;
mod rendered_sampling;
mod rendered_tool_choice;
mod responses_sdk;
#[allow(dead_code)] // each module uses a subset
mod support;
mod viewer;

//! agl's wire types, one definition per contract, shared by the server, its
//! clients, the test engine and the export: serde both ways, no I/O. The
//! ones the gateway's routes read and write also derive their OpenAPI
//! schemas (`utoipa`), which its `/openapi.json` is generated from.
//!
//! - [`rollout`]: the rollout record as exported (rollout JSONL), the
//!   samples plugins return, statuses and modes.
//! - [`api`]: the management API's bodies (`/v1/rollouts`, events, engines).
//! - [`record`]: the `model_request` event payload the proxy writes and
//!   the export reads, and the `reward` event a harness posts.
//! - [`urls`]: the proxy and events URLs handed to agents, and engine base
//!   URLs in one normal form.
//! - [`ids`]: token-id lists written as JSON text without serde's
//!   per-element calls.
//! - [`json`]: [`json::JsonText`], JSON kept as text, and the nesting and
//!   number limits every stored document is checked against.
//! - [`error`]: the `{"error": {"message", "type"}}` body.
//! - [`openai`], [`anthropic`], [`responses`]: the model API bodies agl
//!   builds (Chat Completions and Completions with vLLM's token fields,
//!   Messages, Responses), shared by the gateway, the inference server and
//!   the test engine.

pub mod anthropic;
pub mod api;
pub mod error;
pub mod ids;
pub mod json;
pub mod metrics;
pub mod openai;
pub mod record;
pub mod responses;
pub mod rollout;
pub mod urls;

pub use error::{ApiError, ErrorBody};

/// Response header (and body field `weight_version`) carrying the weight
/// version that served a call.
pub const WEIGHT_VERSION_HEADER: &str = "x-agl-weight-version";

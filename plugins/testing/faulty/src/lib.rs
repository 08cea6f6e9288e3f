//! A test-only plugin whose behaviour is chosen by its config `{"fault": ...}`
//! or, overriding it for one call, by the rollout input's `fault` key.
//! It is written with plain `wit-bindgen`, not the guest SDK, so host tests
//! do not depend on the SDK.
//!
//! Faults of the `sample-adapter` build:
//! - `none`: one valid sample per call, all of its response trainable;
//! - `loop`, `memory`, `panic`: spin, allocate or panic forever;
//! - `stack`: exhaust the wasm call stack; `shadow-stack`: overflow Rust's
//!   stack in linear memory;
//! - `malformed`: a trainable span past the end of the response;
//! - `error`: return Err;
//! - `fs`, `net`: try /etc/passwd and a TCP connect (to the input's
//!   `target`, default 127.0.0.1:1); Err when denied, else a
//!   sample whose break detail tells what leaked;
//! - `env`, `clock`, `imports`: Err describing what the guest sees of its
//!   environment, its clocks and the host imports;
//! - `links` (0.2 only): one sample per call whose break detail is
//!   `continues=<the call's continues>`, kind `summary` when it has one,
//!   `sub-agent` when not.
//! - `choices` (0.3): one sample per call whose `other` break's detail is
//!   `choice=<(index, count)> constrained=<bool>`.
//! - `versions` (0.4): one sample per call whose `other` break's detail is
//!   `versions=<the call's response-versions>`.
//! - `prompts` (0.5): one sample per call whose `other` break's detail is
//!   the call's prompt link (`extends`, `shared`, the tail's length), the
//!   lengths of the request and response JSON the host serves for it, and
//!   what it serves for a call the rollout lacks (`beyond`).
//! - `merged` (0.6): the host's merge (`samples.merge`), each break's
//!   detail followed by ` | after=<the call whose chain it broke>`.
//!
//! Built with the `wit-v0-1` ... `wit-v0-5` feature it is a plugin of the
//! frozen `agl:adapter@0.1.0` ... `@0.5.0` (`wit/v0.1`, ...), for the host's
//! compatibility tests.
//!
//! Built with the `reward` feature it exports the `reward` world instead:
//! `none` scores 1.0, `unscored` returns no reward, `nan` returns NaN,
//! `calls` scores the number of calls; `loop`, `memory`, `panic`, `stack`,
//! `shadow-stack`, `error`, `fs`, `net`, `env` and `clock` behave as above
//! (a leak is reported as Err too).

mod faults;

#[cfg(not(feature = "reward"))]
mod adapter;
#[cfg(feature = "reward")]
mod reward;

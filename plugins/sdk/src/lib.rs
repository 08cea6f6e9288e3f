//! Guest SDK for agl plugins: implement a trait, call one macro, build with
//! `cargo build --release --target wasm32-wasip2`.
//!
//! ```
//! use agl_plugin::{MergeOptions, Rollout, Sample};
//!
//! struct MyAdapter;
//!
//! impl agl_plugin::SampleAdapter for MyAdapter {
//!     fn build_samples(rollout: Rollout) -> Result<Vec<Sample>, String> {
//!         Ok(agl_plugin::merge_chains(&rollout, &MergeOptions::default()))
//!     }
//! }
//!
//! agl_plugin::export_adapter!(MyAdapter);
//! ```
//!
//! Plugins with state worth building once (a parsed config, a compiled
//! regex) implement [`StatefulAdapter`] / [`StatefulReward`] instead and
//! export with [`export_stateful_adapter!`] / [`export_stateful_reward!`]:
//! `new()` runs once per plugin instance, not per rollout.
//!
//! The same code compiles natively, where the host imports (`log`,
//! `config`, `tokenizer`, `rollout-data`, `samples`) are served by
//! `testing` (the merge by the host's own rules, [`agl_samples`]), so
//! plugin logic is unit-testable with `cargo test` and benchmarkable
//! natively.
//!
//! What is here:
//! - host imports: [`log`], [`config()`] / [`config_json`], [`tokenizer`];
//! - reading calls and rollouts: [`request_messages`], [`assistant_message`],
//!   [`assistant_text`], [`tag`] / [`agent`], [`input`], [`last_reward`];
//!   what the host hands over on demand ([`data`]): [`request_json`],
//!   [`response_json`], [`prompt_ids`];
//! - building samples: [`merge_chains`] (the host merges the whole
//!   rollout, one chain per agent), [`merge_chains_with`] (the same with a
//!   harness's own break classifier), [`classify_break`] (why a chain
//!   broke, by the host's rules; see [`breaks`]), [`SampleBuilder`] (one
//!   chain of calls, built in the plugin);
//!   [`messages::same_message`] (turn comparison tolerant of echo noise),
//!   [`starts_with_ids`] / [`common_prefix_len`] (vectorised id compare);
//! - `testing` (native only): config, fake tokenizer, captured logs and
//!   builders for hand-made rollouts.

#[doc(hidden)]
pub mod bindings;

pub mod call;
pub mod config;
pub mod data;
pub mod log;
pub mod rollout;
pub mod samples;
#[cfg(not(target_arch = "wasm32"))]
pub mod testing;
pub mod tokenizer;

pub use bindings::adapter::agl::adapter::types::{
    ApiKind, BreakKind, CallChoice, ChainBreak, Event, ModelCall, PluginInfo, Prompt, Rollout,
    RolloutStatus, Sample, Span, Tag,
};
/// Where a call's ids first differ from an earlier one's, a `summary`
/// break found by a harness's compaction text: the rules the host's
/// [`merge_chains`] classifies by, for an adapter's own classifier.
pub mod breaks {
    pub use agl_samples::breaks::{Divergence, marked_summary};
}
/// Comparing conversations across calls (echo noise tolerated).
pub use agl_samples::messages;
pub use agl_samples::{common_prefix_len, starts_with_ids};
pub use call::{agent, assistant_message, assistant_text, request_messages, tag};
pub use config::{config, config_json};
pub use data::{prompt_ids, prompt_len, request_json, response_json};
pub use rollout::{input, last_reward};
pub use samples::{
    MergeOptions, SampleBuilder, classify_break, merge_chains, merge_chains_with, merge_configured,
};

/// A sample-adapter plugin: one finished rollout in, training samples out.
/// Export it with [`export_adapter!`].
pub trait SampleAdapter {
    /// An error fails this rollout's sample build (it is recorded), never
    /// the host.
    fn build_samples(rollout: Rollout) -> Result<Vec<Sample>, String>;
}

/// A reward plugin. Export it with [`export_reward!`].
pub trait Reward {
    /// `None`: this rollout has no reward and is excluded (not scored 0).
    fn reward(rollout: Rollout) -> Result<Option<f64>, String>;
}

/// A sample adapter with state built once per plugin instance: parse the
/// config, compile patterns and the like in [`new`](Self::new) instead of
/// on every rollout. Export it with [`export_stateful_adapter!`].
///
/// Each Wasm instance has its own memory, so "once" means once per
/// instance the host starts (a few per plugin, reused across rollouts).
pub trait StatefulAdapter: Sized + Send + Sync + 'static {
    /// Reads [`config()`] and builds the state. An error fails every
    /// rollout this instance is given, with this message.
    fn new() -> Result<Self, String>;
    fn build_samples(&self, rollout: Rollout) -> Result<Vec<Sample>, String>;
}

/// A reward with state built once per plugin instance (see
/// [`StatefulAdapter`]). Export it with [`export_stateful_reward!`].
pub trait StatefulReward: Sized + Send + Sync + 'static {
    fn new() -> Result<Self, String>;
    /// `None`: this rollout has no reward and is excluded (not scored 0).
    fn reward(&self, rollout: Rollout) -> Result<Option<f64>, String>;
}

/// The instance state in `cell`, built by `new` on first use. The export
/// macros keep one `cell` per exported type; its error, if any, is kept and
/// returned on every call.
#[doc(hidden)]
pub fn __instance<T>(
    cell: &'static std::sync::OnceLock<Result<T, String>>,
    new: fn() -> Result<T, String>,
) -> Result<&'static T, String> {
    cell.get_or_init(new).as_ref().map_err(Clone::clone)
}

/// Exports a [`SampleAdapter`] as the component's `sample-adapter` world;
/// `describe()` reports the plugin crate's name, version and description.
/// Natively it only checks the impl (no symbols are exported).
#[macro_export]
macro_rules! export_adapter {
    ($adapter:ty) => {
        const _: () = {
            #[allow(dead_code)]
            struct AglSampleAdapterExport;

            impl $crate::bindings::adapter::Guest for AglSampleAdapterExport {
                fn describe() -> $crate::PluginInfo {
                    $crate::__plugin_info!()
                }

                fn build_samples(
                    rollout: $crate::Rollout,
                ) -> ::core::result::Result<::std::vec::Vec<$crate::Sample>, ::std::string::String>
                {
                    <$adapter as $crate::SampleAdapter>::build_samples(rollout)
                }
            }

            #[cfg(target_arch = "wasm32")]
            $crate::bindings::adapter::export_sample_adapter!(
                AglSampleAdapterExport with_types_in $crate::bindings::adapter
            );
        };
    };
}

/// Exports a [`Reward`] as the component's `reward` world; `describe()`
/// reports the plugin crate's name, version and description.
#[macro_export]
macro_rules! export_reward {
    ($reward:ty) => {
        const _: () = {
            #[allow(dead_code)]
            struct AglRewardExport;

            impl $crate::bindings::reward::Guest for AglRewardExport {
                fn describe() -> $crate::PluginInfo {
                    $crate::__plugin_info!()
                }

                fn reward(
                    rollout: $crate::Rollout,
                ) -> ::core::result::Result<::core::option::Option<f64>, ::std::string::String>
                {
                    <$reward as $crate::Reward>::reward(rollout)
                }
            }

            #[cfg(target_arch = "wasm32")]
            $crate::bindings::reward::export_reward_world!(
                AglRewardExport with_types_in $crate::bindings::reward
            );
        };
    };
}

/// Exports a [`StatefulAdapter`] as the component's `sample-adapter` world.
#[macro_export]
macro_rules! export_stateful_adapter {
    ($adapter:ty) => {
        const _: () = {
            static INSTANCE: ::std::sync::OnceLock<
                ::core::result::Result<$adapter, ::std::string::String>,
            > = ::std::sync::OnceLock::new();

            struct AglStatelessView;

            impl $crate::SampleAdapter for AglStatelessView {
                fn build_samples(
                    rollout: $crate::Rollout,
                ) -> ::core::result::Result<::std::vec::Vec<$crate::Sample>, ::std::string::String>
                {
                    let state =
                        $crate::__instance(&INSTANCE, <$adapter as $crate::StatefulAdapter>::new)?;
                    <$adapter as $crate::StatefulAdapter>::build_samples(state, rollout)
                }
            }

            $crate::export_adapter!(AglStatelessView);
        };
    };
}

/// Exports a [`StatefulReward`] as the component's `reward` world.
#[macro_export]
macro_rules! export_stateful_reward {
    ($reward:ty) => {
        const _: () = {
            static INSTANCE: ::std::sync::OnceLock<
                ::core::result::Result<$reward, ::std::string::String>,
            > = ::std::sync::OnceLock::new();

            struct AglStatelessView;

            impl $crate::Reward for AglStatelessView {
                fn reward(
                    rollout: $crate::Rollout,
                ) -> ::core::result::Result<::core::option::Option<f64>, ::std::string::String>
                {
                    let state =
                        $crate::__instance(&INSTANCE, <$reward as $crate::StatefulReward>::new)?;
                    <$reward as $crate::StatefulReward>::reward(state, rollout)
                }
            }

            $crate::export_reward!(AglStatelessView);
        };
    };
}

/// The calling crate's package metadata (expanded there, so `env!` reads
/// the plugin's Cargo.toml, not the SDK's).
#[doc(hidden)]
#[macro_export]
macro_rules! __plugin_info {
    () => {
        $crate::PluginInfo {
            name: ::std::string::String::from(env!("CARGO_PKG_NAME")),
            version: ::std::string::String::from(env!("CARGO_PKG_VERSION")),
            description: ::std::string::String::from(env!("CARGO_PKG_DESCRIPTION")),
        }
    };
}

#[cfg(test)]
mod instance_tests {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicUsize, Ordering};

    static BUILT: AtomicUsize = AtomicUsize::new(0);

    fn build() -> Result<u32, String> {
        BUILT.fetch_add(1, Ordering::SeqCst);
        Ok(7)
    }

    #[test]
    fn instance_state_is_built_once_and_errors_are_kept() {
        static CELL: OnceLock<Result<u32, String>> = OnceLock::new();
        for _ in 0..3 {
            assert_eq!(super::__instance(&CELL, build), Ok(&7));
        }
        assert_eq!(BUILT.load(Ordering::SeqCst), 1);
        static BAD: OnceLock<Result<u32, String>> = OnceLock::new();
        let fail = || Err::<u32, _>("invalid plugin config: x".to_string());
        for _ in 0..2 {
            assert_eq!(
                super::__instance(&BAD, fail),
                Err("invalid plugin config: x".into())
            );
        }
    }
}

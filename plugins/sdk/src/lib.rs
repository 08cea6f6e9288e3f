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
//! The same code compiles natively, where the host imports (`log`,
//! `config`, `tokenizer`) are served by `testing`, so plugin logic is
//! unit-testable with `cargo test` and benchmarkable natively.
//!
//! What is here:
//! - host imports: [`log`], [`config()`] / [`config_json`], [`tokenizer`];
//! - reading calls and rollouts: [`request_messages`], [`assistant_message`],
//!   [`assistant_text`], [`tag`] / [`agent`], [`input`], [`last_reward`];
//! - building samples: [`SampleBuilder`] (one chain of calls),
//!   [`merge_chains`] (a whole rollout, one chain per agent),
//!   [`merge_chains_with`] (the same with a harness's own break classifier),
//!   [`classify_break`] (why a chain broke; see [`breaks`]),
//!   [`messages::same_message`] (turn comparison tolerant of echo noise),
//!   [`starts_with_ids`] / [`common_prefix_len`] (vectorised id compare);
//! - `testing` (native only): config, fake tokenizer, captured logs and
//!   builders for hand-made rollouts.

#[doc(hidden)]
pub mod bindings;

pub mod breaks;
pub mod builder;
pub mod call;
pub mod config;
pub mod log;
pub mod merge;
pub mod messages;
pub mod prefix;
pub mod rollout;
#[cfg(not(target_arch = "wasm32"))]
pub mod testing;
pub mod tokenizer;

pub use bindings::adapter::agl::adapter::types::{
    ApiKind, BreakKind, ChainBreak, Event, ModelCall, PluginInfo, Rollout, RolloutStatus, Sample,
    Span, Tag,
};
pub use breaks::classify_break;
pub use builder::SampleBuilder;
pub use call::{agent, assistant_message, assistant_text, request_messages, tag};
pub use config::{config, config_json};
pub use merge::{MergeOptions, merge_chains, merge_chains_with};
pub use prefix::{common_prefix_len, starts_with_ids};
pub use rollout::{input, last_reward};

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

//! Per-instance store data and the host side of the `agl:adapter` imports.

use std::sync::Arc;

use wasmtime::ResourceLimiter;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use super::bindings::v0_1::sample::agl::adapter as v0_1;
use super::bindings::v0_2::sample::agl::adapter as v0_2;
use super::bindings::v0_3::sample::agl::adapter as v0_3;
use super::bindings::v0_4::sample::agl::adapter as v0_4;
use super::bindings::v0_5::sample::agl::adapter as v0_5;
use super::bindings::v0_6::sample::agl::adapter::{config, log, rollout_data, tokenizer, types};
use super::sandbox;
use super::stdio::TailPipe;
use agl_samples::links::Link;
use agl_tokenizer::Tokenizer;
use agl_wire::rollout::{ModelCall, Rollout};

/// Longest log line forwarded from a guest; the rest is cut off.
const MAX_LOG_LINE: usize = 16 * 1024;

/// What every instance of one plugin shares: its identity, config and the
/// tokenizer it may use.
pub(crate) struct PluginEnv {
    pub name: String,
    /// The plugin's config table as JSON text (`{}` when it has none).
    pub config_json: String,
    pub tokenizer: Option<Arc<Tokenizer>>,
}

/// The `T` of `Store<T>` for one plugin instance.
pub(crate) struct PluginState {
    wasi: WasiCtx,
    table: ResourceTable,
    pub limits: MemoryCap,
    pub(crate) env: Arc<PluginEnv>,
    /// The rollout of the entry-point call under way, served through
    /// `rollout-data` and `samples`; `None` between calls.
    pub rollout: Option<Arc<Rollout>>,
    /// Its prompt links, once found (`links()`, in `samples.rs`).
    pub(crate) links: Option<Arc<Vec<Link>>>,
}

impl PluginState {
    pub(crate) fn new(env: Arc<PluginEnv>, memory_bytes: usize, stderr: &TailPipe) -> Self {
        Self {
            wasi: sandbox::wasi_ctx(stderr),
            table: ResourceTable::new(),
            limits: MemoryCap::new(memory_bytes),
            env,
            rollout: None,
            links: None,
        }
    }

    /// Serves `rollout` to the entry-point call about to run (`None`: the
    /// call is over).
    pub(crate) fn serve(&mut self, rollout: Option<Arc<Rollout>>) {
        self.rollout = rollout;
        self.links = None;
    }
}

impl WasiView for PluginState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

/// Caps linear memory and remembers whether the cap was hit, so that the
/// resulting trap can be reported as out-of-memory rather than a generic trap.
pub(crate) struct MemoryCap {
    cap: usize,
    pub exceeded: bool,
}

/// Tables hold function references; Rust guests use a few hundred entries.
const MAX_TABLE_ELEMENTS: usize = 100_000;

impl MemoryCap {
    fn new(cap: usize) -> Self {
        Self {
            cap,
            exceeded: false,
        }
    }
}

impl ResourceLimiter for MemoryCap {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.cap {
            self.exceeded = true;
            // Trapping (instead of failing `memory.grow`) stops the guest at
            // once rather than letting it abort with a less clear message.
            wasmtime::bail!(
                "memory cap of {} bytes exceeded (wanted {desired})",
                self.cap
            );
        }
        Ok(true)
    }

    fn memory_grow_failed(&mut self, error: wasmtime::Error) -> wasmtime::Result<()> {
        self.exceeded = true;
        Err(error.context("linear memory could not grow"))
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= MAX_TABLE_ELEMENTS)
    }
}

impl types::Host for PluginState {}

impl log::Host for PluginState {
    fn log(&mut self, level: log::Level, message: String) {
        let plugin = self.env.name.as_str();
        let message = truncate(&message, MAX_LOG_LINE);
        match level {
            log::Level::Trace => tracing::trace!(plugin, "{message}"),
            log::Level::Debug => tracing::debug!(plugin, "{message}"),
            log::Level::Info => tracing::info!(plugin, "{message}"),
            log::Level::Warn => tracing::warn!(plugin, "{message}"),
            log::Level::Error => tracing::error!(plugin, "{message}"),
        }
    }
}

impl config::Host for PluginState {
    fn get(&mut self) -> String {
        self.env.config_json.clone()
    }
}

impl PluginState {
    /// Call `index` of the rollout under way.
    fn call(&self, index: u32) -> Option<&ModelCall> {
        let calls = &self.rollout.as_deref()?.calls;
        // Calls are numbered by position; look further only if not.
        calls
            .get(index as usize)
            .filter(|c| c.index == index)
            .or_else(|| calls.iter().find(|c| c.index == index))
    }
}

impl rollout_data::Host for PluginState {
    fn request_json(&mut self, index: u32) -> Option<String> {
        self.call(index).map(|c| c.request.as_str().to_owned())
    }

    fn response_json(&mut self, index: u32) -> Option<String> {
        self.call(index).map(|c| c.response.as_str().to_owned())
    }

    fn prompt_ids(&mut self, index: u32) -> Option<Vec<u32>> {
        self.call(index).map(|c| c.prompt_ids.clone())
    }
}

const NO_TOKENIZER: &str = "no tokenizer configured: the host was started without a tokenizer.json";

impl PluginState {
    fn tokenizer(&self) -> Result<&Tokenizer, String> {
        self.env
            .tokenizer
            .as_deref()
            .ok_or_else(|| NO_TOKENIZER.to_string())
    }
}

impl tokenizer::Host for PluginState {
    fn available(&mut self) -> bool {
        self.env.tokenizer.is_some()
    }

    fn vocab_size(&mut self) -> Result<u32, String> {
        let tokenizer = self.tokenizer()?;
        shielded(|| Ok(tokenizer.vocab_size()))
    }

    fn encode(&mut self, text: String, add_special_tokens: bool) -> Result<Vec<u32>, String> {
        let tokenizer = self.tokenizer()?;
        shielded(|| {
            tokenizer
                .encode(&text, add_special_tokens)
                .map_err(|e| e.to_string())
        })
    }

    fn decode(&mut self, ids: Vec<u32>, skip_special_tokens: bool) -> Result<String, String> {
        let tokenizer = self.tokenizer()?;
        shielded(|| {
            tokenizer
                .decode(&ids, skip_special_tokens)
                .map_err(|e| e.to_string())
        })
    }

    fn apply_chat_template(
        &mut self,
        messages_json: String,
        tools_json: Option<String>,
        add_generation_prompt: bool,
    ) -> Result<String, String> {
        let tokenizer = self.tokenizer()?;
        shielded(|| {
            tokenizer
                .apply_chat_template(&messages_json, tools_json.as_deref(), add_generation_prompt)
                .map_err(|e| e.to_string())
        })
    }
}

/// An older version's imports are the current ones under that version:
/// the same functions.
macro_rules! older_imports {
    ($v:ident) => {
        impl $v::types::Host for PluginState {}

        impl $v::log::Host for PluginState {
            fn log(&mut self, level: $v::log::Level, message: String) {
                use $v::log::Level as Old;
                let level = match level {
                    Old::Trace => log::Level::Trace,
                    Old::Debug => log::Level::Debug,
                    Old::Info => log::Level::Info,
                    Old::Warn => log::Level::Warn,
                    Old::Error => log::Level::Error,
                };
                log::Host::log(self, level, message)
            }
        }

        impl $v::config::Host for PluginState {
            fn get(&mut self) -> String {
                config::Host::get(self)
            }
        }

        impl $v::tokenizer::Host for PluginState {
            fn available(&mut self) -> bool {
                tokenizer::Host::available(self)
            }

            fn vocab_size(&mut self) -> Result<u32, String> {
                tokenizer::Host::vocab_size(self)
            }

            fn encode(
                &mut self,
                text: String,
                add_special_tokens: bool,
            ) -> Result<Vec<u32>, String> {
                tokenizer::Host::encode(self, text, add_special_tokens)
            }

            fn decode(
                &mut self,
                ids: Vec<u32>,
                skip_special_tokens: bool,
            ) -> Result<String, String> {
                tokenizer::Host::decode(self, ids, skip_special_tokens)
            }

            fn apply_chat_template(
                &mut self,
                messages_json: String,
                tools_json: Option<String>,
                add_generation_prompt: bool,
            ) -> Result<String, String> {
                tokenizer::Host::apply_chat_template(
                    self,
                    messages_json,
                    tools_json,
                    add_generation_prompt,
                )
            }
        }
    };
}

older_imports!(v0_1);
older_imports!(v0_2);
older_imports!(v0_3);
older_imports!(v0_4);
older_imports!(v0_5);

impl v0_5::rollout_data::Host for PluginState {
    fn request_json(&mut self, index: u32) -> Option<String> {
        rollout_data::Host::request_json(self, index)
    }

    fn response_json(&mut self, index: u32) -> Option<String> {
        rollout_data::Host::response_json(self, index)
    }

    fn prompt_ids(&mut self, index: u32) -> Option<Vec<u32>> {
        rollout_data::Host::prompt_ids(self, index)
    }
}

/// Guest-chosen input reaches third-party tokenizer code here; a panic in it
/// becomes an error for the guest instead of unwinding into the caller.
fn shielded<T>(call: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(call))
        .unwrap_or_else(|_| Err("the host tokenizer panicked on this input".to_string()))
}

/// `s` cut to at most `max` bytes on a char boundary.
fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

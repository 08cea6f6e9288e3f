//! `[gateway]`: the gateway section of `agl.toml`, owned here.

use serde::Deserialize;

/// `[gateway]`: the HTTP service (`agl serve`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GatewayConfig {
    /// Address `agl serve` binds (`--listen` overrides it).
    pub listen: String,
    /// Bearer key for the management API. Unset (and `admin_key_env` unset
    /// in the environment) = auth off.
    pub admin_key: Option<String>,
    /// Environment variable read for the admin key when `admin_key` is unset.
    pub admin_key_env: String,
    /// Secret rollout tokens are derived from. Unset = derived from the admin
    /// key, so tokens survive restarts either way.
    pub token_secret: Option<String>,
    /// Environment variable read for the token secret when it is unset.
    pub token_secret_env: String,
    /// Largest request body accepted, in bytes (413 above it).
    pub body_limit_bytes: usize,
    /// Connections held open at once; more wait in the accept queue.
    pub max_connections: usize,
    /// Seconds a connection has to deliver a complete request head once the
    /// server waits for one: bounds slow headers and idle keep-alive
    /// connections alike.
    pub header_timeout_secs: f64,
    /// Seconds a request body has to arrive in full (408 after).
    pub body_timeout_secs: f64,
    /// A streamed Anthropic Messages answer sends a `ping` event after this
    /// many seconds without engine output (as Anthropic's API does), so
    /// idle-cutting proxies and clients keep the stream.
    pub stream_ping_secs: f64,
    /// Gateway-rendered calls on a policy whose context is known: a
    /// `max_tokens` beyond what the prompt leaves is lowered to it (and an
    /// absent one set to it) rather than failing at the engine. Off: sent
    /// as asked.
    pub clamp_max_tokens: bool,
    /// Gateway-rendered calls: the most tokens one answer may have, whatever
    /// the harness asks (or when it asks for none, as Codex does); unset:
    /// the harness's ask, within the context.
    pub max_tokens: Option<u32>,
    /// Base URL agents reach the gateway at, used in proxy URLs; unset =
    /// `http://<listen>`.
    pub public_base_url: Option<String>,
    /// Sampling temperature the proxy forces for train / val rollouts.
    pub train_temperature: f64,
    pub val_temperature: f64,
    /// Calls that ask the engine to constrain its output (JSON
    /// `response_format`, `structured_outputs`, a forced `tool_choice` the
    /// engine enforces): `allow` serves and records them `constrained`
    /// (their logprobs are under the masked distribution), `refuse` answers
    /// them 400.
    pub constrained: ConstrainedCalls,
    /// The most choices one call may ask for (`n`); each is recorded as
    /// its own call. More is a 400 naming `n`.
    pub max_n: u32,
}

/// `gateway.constrained`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConstrainedCalls {
    #[default]
    Allow,
    Refuse,
}

impl Default for GatewayConfig {
    fn default() -> Self {
        GatewayConfig {
            listen: "127.0.0.1:8400".into(),
            admin_key: None,
            admin_key_env: "AGL_ADMIN_KEY".into(),
            token_secret: None,
            token_secret_env: "AGL_TOKEN_SECRET".into(),
            body_limit_bytes: 32 * 1024 * 1024,
            max_connections: 4096,
            header_timeout_secs: 30.0,
            body_timeout_secs: 60.0,
            stream_ping_secs: 5.0,
            clamp_max_tokens: true,
            max_tokens: None,
            public_base_url: None,
            train_temperature: 1.0,
            val_temperature: 0.0,
            constrained: ConstrainedCalls::Allow,
            max_n: 16,
        }
    }
}

impl GatewayConfig {
    /// Refuses limits the server cannot run with, naming the key.
    pub fn check(&self) -> Result<(), String> {
        if self.max_connections == 0 {
            return Err("gateway.max_connections must be at least 1".into());
        }
        if self.max_n == 0 {
            return Err("gateway.max_n must be at least 1".into());
        }
        if self.max_tokens == Some(0) {
            return Err("gateway.max_tokens must be at least 1 (or unset)".into());
        }
        for (key, secs) in [
            ("header_timeout_secs", self.header_timeout_secs),
            ("body_timeout_secs", self.body_timeout_secs),
            ("stream_ping_secs", self.stream_ping_secs),
        ] {
            if !(secs.is_finite() && secs > 0.0) {
                return Err(format!(
                    "gateway.{key} must be a positive number of seconds, not {secs}"
                ));
            }
        }
        Ok(())
    }

    /// `secs` as a duration; a value [`GatewayConfig::check`] refuses
    /// (negative, NaN) falls back to 1 s.
    pub fn seconds(secs: f64) -> std::time::Duration {
        std::time::Duration::try_from_secs_f64(secs).unwrap_or(std::time::Duration::from_secs(1))
    }

    /// Fills the admin key and token secret from the environment where the
    /// file leaves them unset. Called at the edge (`agl serve`), so library
    /// users and tests see only what they configured.
    pub fn with_env(mut self) -> Self {
        let from_env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        if self.admin_key.is_none() {
            self.admin_key = from_env(&self.admin_key_env);
        }
        if self.token_secret.is_none() {
            self.token_secret = from_env(&self.token_secret_env);
        }
        self
    }
}

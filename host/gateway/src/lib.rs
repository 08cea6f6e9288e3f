//! The gateway: agl's HTTP service. This module holds the management API
//! under `/v1` (rollouts, events, engines, proxy pause/drain), `/healthz`
//! and `/metrics`; the OpenAI-compatible proxy under `/proxy/...` plugs into
//! the same [`AppState`] and shares [`ProxyControl`] with it. Every route
//! is listed once (`routes.rs`) with its OpenAPI description, served at
//! `/openapi.json` (`openapi/`).
//!
//! Every error, including axum's own rejections, unknown routes and wrong
//! methods, answers as `{"error": {"message", "type"}}` (see `error.rs`).

mod auth;
mod config;
mod control;
mod engines;
mod error;
mod events;
mod extract;
mod local;
mod metrics;
mod openapi;
mod plugins;
mod policies;
mod proxy;
mod proxy_admin;
mod rollouts;
mod routes;
pub mod runtime;
mod server;
mod service;
mod viewer;
mod weights;

use std::future::Future;
use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::middleware::from_fn_with_state;
use tokio::net::TcpListener;

pub use auth::{Auth, Principal, RolloutAttempt};
pub use control::{CallGuard, InFlightCall, ProxyControl};
pub use error::ApiError;
pub use metrics::{Metrics, MetricsSource};
pub use plugins::{PluginAdmin, PluginFuture, PluginSource, SharedPluginAdmin};
pub use viewer::{SampleViewer, SharedSampleViewer};

use agl_conversation::Renderer;
use agl_store::Store;
pub use config::{ConstrainedCalls, GatewayConfig};

/// Secret used for rollout tokens when neither a token secret nor an admin
/// key is configured. Auth is off then, so tokens are never checked.
const INSECURE_SECRET: &[u8] = b"agl-auth-off";

/// What every handler shares, in one allocation: the clones a request
/// takes (axum's `State`, its call's record) each cost one reference
/// count, not one per part (~5% of the proxy's CPU at 64 connections,
/// `benches/gateway.rs`).
#[derive(Clone)]
pub struct AppState(Arc<Shared>);

impl std::ops::Deref for AppState {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}

/// The parts of [`AppState`].
#[derive(Clone)]
pub struct Shared {
    pub store: Store,
    pub auth: Arc<Auth>,
    pub control: Arc<ProxyControl>,
    pub metrics: Arc<Metrics>,
    pub config: Arc<GatewayConfig>,
    /// `public_base_url` without a trailing `/`.
    pub public_base: Arc<str>,
    /// The proxy's pooled client for engine calls.
    pub upstream: proxy::Upstream,
    /// Spots client retries so only the last copy of a call is exported.
    pub retries: proxy::RetryIndex,
    /// Extra metrics `/metrics` appends (see [`Gateway::with_metrics_source`]).
    pub extra_metrics: Option<Arc<dyn MetricsSource>>,
    /// The hosting run's plugins (see [`Gateway::with_plugin_admin`]).
    pub plugins: Option<SharedPluginAdmin>,
    /// Hosts a gateway with auth off answers to (see `local.rs`).
    pub local_hosts: Arc<local::LocalHosts>,
    /// The policies engines that render on the gateway render with (see
    /// [`Gateway::with_policy`]).
    pub policies: Arc<policies::Policies>,
    /// Token-exact continuation state per rollout attempt.
    pub chains: proxy::ChainIndex,
    /// What the viewer reads besides the store.
    pub viewer: viewer::ViewerSources,
    /// What `GET /openapi.json` answers, made by the first [`Gateway::router`].
    pub openapi: std::sync::OnceLock<openapi::Document>,
}

pub struct Gateway {
    state: AppState,
}

impl Gateway {
    /// `config` is used as given (see [`GatewayConfig::with_env`] for the
    /// environment fallbacks).
    pub fn new(store: Store, config: GatewayConfig) -> Gateway {
        let secret = match (&config.token_secret, &config.admin_key) {
            (Some(s), _) => s.as_bytes().to_vec(),
            // Domain-separated so a token never equals anything keyed by the
            // admin key itself.
            (None, Some(k)) => [b"agl-rollout-token:".as_slice(), k.as_bytes()].concat(),
            (None, None) => INSECURE_SECRET.to_vec(),
        };
        let auth = Auth::new(config.admin_key.clone(), secret);
        if !auth.enabled() {
            // On loopback only this machine's processes reach it (and only
            // with loopback Host headers): the local default, not a warning.
            let loopback = config
                .listen
                .parse::<std::net::SocketAddr>()
                .is_ok_and(|a| a.ip().is_loopback());
            if loopback {
                tracing::info!("no gateway admin key configured: authentication is off");
            } else {
                tracing::warn!("no gateway admin key configured: authentication is OFF");
            }
        }
        let public_base = config
            .public_base_url
            .clone()
            .unwrap_or_else(|| format!("http://{}", config.listen));
        Gateway {
            state: AppState(Arc::new(Shared {
                store,
                auth: Arc::new(auth),
                control: ProxyControl::new(),
                metrics: Arc::new(Metrics::default()),
                public_base: public_base.trim_end_matches('/').into(),
                upstream: proxy::Upstream::default(),
                retries: proxy::RetryIndex::default(),
                extra_metrics: None,
                plugins: None,
                local_hosts: Arc::new(local::LocalHosts::new(config.public_base_url.as_deref())),
                policies: Arc::default(),
                chains: proxy::ChainIndex::default(),
                viewer: viewer::ViewerSources::default(),
                openapi: std::sync::OnceLock::new(),
                config: Arc::new(config),
            })),
        }
    }

    /// The parts, for the builders below (before [`Gateway::router`] takes
    /// its clones; one taken earlier keeps the parts as they were).
    fn parts(&mut self) -> &mut Shared {
        Arc::make_mut(&mut self.state.0)
    }

    /// Makes `/metrics` also render `source` (e.g. the trainer's gauges when
    /// `agl run` hosts the gateway). Call before [`Gateway::router`].
    pub fn with_metrics_source(mut self, source: Arc<dyn MetricsSource>) -> Gateway {
        self.parts().extra_metrics = Some(source);
        self
    }

    /// The gateway's own policy (template and tokenizer): what engines
    /// registered with `render = "gateway"` and no `policy` folder of their
    /// own render with. Call before [`Gateway::router`].
    pub fn with_policy(mut self, renderer: Renderer) -> Gateway {
        self.parts().policies = Arc::new(policies::Policies::with_own(renderer));
        self
    }

    /// The run's `metrics.jsonl`, served as `GET /v1/steps` (the viewer's
    /// runs page).
    pub fn with_metrics_file(mut self, path: std::path::PathBuf) -> Gateway {
        self.parts().viewer.metrics_file = Some(path);
        self
    }

    /// What builds a rollout's samples for `GET /v1/rollouts/{id}/samples`.
    pub fn with_sample_viewer(mut self, viewer: SharedSampleViewer) -> Gateway {
        self.parts().viewer.samples = Some(viewer);
        self
    }

    /// Serves `/v1/plugins` with `admin` (the hosting `agl run`'s plugins).
    /// Call before [`Gateway::router`].
    pub fn with_plugin_admin(mut self, admin: SharedPluginAdmin) -> Gateway {
        self.parts().plugins = Some(admin);
        self
    }

    pub fn state(&self) -> &AppState {
        &self.state
    }

    /// Serves engine base URL `embedded://{name}` in-process with `router`
    /// (see `inference::embed`).
    pub fn register_embedded(&self, name: &str, router: Router) {
        self.state.upstream.register_embedded(name, router);
    }

    /// The pause flag and in-flight registry the proxy uses.
    pub fn control(&self) -> Arc<ProxyControl> {
        self.state.control.clone()
    }

    pub fn router(&self) -> Router {
        let st = self.state.clone();
        let (router, api) = self.routes();
        st.openapi.get_or_init(|| openapi::Document::new(&api));
        let mut router = router
            .fallback(error::unknown_route)
            .method_not_allowed_fallback(error::wrong_method);
        if !st.auth.enabled() {
            router = router.layer(from_fn_with_state(st.clone(), local::guard));
        }
        router
            .layer(from_fn_with_state(st.clone(), metrics::track))
            .layer(DefaultBodyLimit::max(st.config.body_limit_bytes))
            .with_state(st)
    }

    /// The OpenAPI 3.1 description of every route [`Gateway::router`]
    /// serves: what `GET /openapi.json` answers.
    pub fn openapi(&self) -> utoipa::openapi::OpenApi {
        self.routes().1
    }

    /// The routes and their description, finished.
    fn routes(&self) -> (Router<AppState>, utoipa::openapi::OpenApi) {
        let (router, mut api) = routes::all(&self.state).split_for_parts();
        openapi::finish(&mut api);
        (router, api)
    }

    /// Serves until `shutdown` resolves, then finishes in-flight requests.
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let limits = server::Limits {
            max_connections: self.state.config.max_connections,
            header_timeout: GatewayConfig::seconds(self.state.config.header_timeout_secs),
        };
        let metrics = self.state.metrics.clone();
        server::serve(listener, self.router(), limits, metrics, shutdown).await
    }
}

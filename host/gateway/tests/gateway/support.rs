//! Shared set-up for the gateway's tests: an in-process gateway in front of
//! a test engine.

use std::sync::Arc;

use agl_gateway::GatewayConfig;
use agl_gateway::{Auth, Gateway, Metrics, ProxyControl};
use agl_store::{Mode, NewRollout, Store};
use agl_testengine::{TestEngine, TestEngineConfig};
use agl_wire::api::StatusPatch;
use agl_wire::rollout::RolloutStatus;

pub const ADMIN: &str = "admin-key";

/// An in-process gateway (admin key [`ADMIN`]) over a fresh store, with a
/// test engine registered as `e1`.
pub struct Local {
    pub base: String,
    pub store: Store,
    pub auth: Arc<Auth>,
    pub control: Arc<ProxyControl>,
    pub metrics: Arc<Metrics>,
    pub engine: TestEngine,
    pub dir: tempfile::TempDir,
}

pub async fn start_local(engine: TestEngineConfig, config: GatewayConfig) -> Local {
    start_local_with(engine, config, None, Default::default()).await
}

/// [`start_local`] with the policy's renderer: engine `e1` renders on the
/// gateway and is reached over `api`.
pub async fn start_local_with(
    engine: TestEngineConfig,
    config: GatewayConfig,
    renderer: Option<agl_conversation::Renderer>,
    api: agl_store::EngineApi,
) -> Local {
    start_local_sized(engine, config, renderer, api, None).await
}

/// [`start_local_with`] rendering with `renderer` over the OpenAI token-in
/// API, rollout `r1` running.
pub async fn rendering_r1(engine: TestEngineConfig, renderer: agl_conversation::Renderer) -> Local {
    let env = start_local_with(
        engine,
        GatewayConfig::default(),
        Some(renderer),
        agl_store::EngineApi::Openai,
    )
    .await;
    env.running(&["r1".to_string()]).await;
    env
}

/// [`start_local_with`] on a policy whose context is `context_len` tokens.
pub async fn start_local_sized(
    engine: TestEngineConfig,
    config: GatewayConfig,
    renderer: Option<agl_conversation::Renderer>,
    api: agl_store::EngineApi,
    context_len: Option<usize>,
) -> Local {
    let engine = TestEngine::start(engine).await.expect("engine");
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path().join("agl.db")).expect("open store");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let config = GatewayConfig {
        listen: addr.to_string(),
        admin_key: Some(ADMIN.into()),
        ..config
    };
    let render = match renderer {
        Some(_) => agl_store::Render::Gateway,
        None => agl_store::Render::Engine,
    };
    let mut gateway = Gateway::new(store.clone(), config);
    if let Some(r) = renderer {
        gateway = gateway.with_policy(r);
    }
    let auth = gateway.state().auth.clone();
    let control = gateway.control();
    let metrics = gateway.state().metrics.clone();
    tokio::spawn(gateway.serve(listener, std::future::pending()));
    // The context is the engine's: given at registration.
    let mut registration = agl_store::RegisterEngine::new("e1", &engine.base_url(), "served-model")
        .with_render(render)
        .with_api(api);
    registration.context_len = context_len.map(|n| n as u64);
    store.register_engine(&registration).await.expect("engine");
    Local {
        base: format!("http://{addr}"),
        store,
        auth,
        control,
        metrics,
        engine,
        dir,
    }
}

impl Local {
    /// Creates `ids` as train rollouts of group `g` and marks them running.
    pub async fn running(&self, ids: &[String]) {
        let batch = ids
            .iter()
            .map(|id| NewRollout {
                id: Some(id.clone()),
                group_id: "g".into(),
                mode: Mode::Train,
                input: Default::default(),
                config: Default::default(),
            })
            .collect();
        self.store.create_rollouts(batch).await.expect("create");
        for id in ids {
            self.store
                .set_status(id, &StatusPatch::to(1, RolloutStatus::Running))
                .await
                .expect("running");
        }
    }

    /// The chat completions URL of rollout `id`'s proxy (attempt 1, train).
    /// `GET /v1/rollouts/{id}` as the admin: the URLs and token its agent gets.
    pub async fn view(&self, id: &str) -> serde_json::Value {
        reqwest::Client::new()
            .get(format!("{}/v1/rollouts/{id}", self.base))
            .bearer_auth(ADMIN)
            .send()
            .await
            .expect("view")
            .json()
            .await
            .expect("view JSON")
    }

    pub fn chat_url(&self, id: &str) -> String {
        format!(
            "{}/proxy/{id}/1/train/openai/v1/chat/completions",
            self.base
        )
    }
}

//! Shared set-up for the gateway's integration tests: the real `agl serve`
//! binary on a free port, or an in-process gateway in front of a test engine.
#![allow(dead_code)] // each test crate uses a subset

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;

use agl::config::GatewayConfig;
use agl::gateway::{Auth, Gateway, Metrics, ProxyControl};
use agl::rollout::RolloutStatus;
use agl::store::{Mode, NewRollout, Store};
use agl::testengine::{EngineConfig, TestEngine};

pub const AGL: &str = env!("CARGO_BIN_EXE_agl");
pub const ADMIN: &str = "admin-key";

/// The port from the "listening" log line (which may carry ANSI colours).
pub fn port_from(line: &str) -> Option<u16> {
    let rest = &line[line.find("http://127.0.0.1:")? + "http://127.0.0.1:".len()..];
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// A running `agl serve`; killed (SIGKILL) when dropped.
pub struct Served {
    pub child: Child,
    pub base: String,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `agl serve --db DB` on a free port with admin key [`ADMIN`] and
/// waits until it listens.
pub fn spawn_serve(db: &Path) -> Served {
    let mut child = Command::new(AGL)
        .args(["serve", "--listen", "127.0.0.1:0", "--db"])
        .arg(db)
        .env("AGL_ADMIN_KEY", ADMIN)
        .env_remove("AGL_CONFIG")
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn agl serve");
    let stderr = child.stderr.take().expect("stderr");
    let mut lines = BufReader::new(stderr).lines();
    let port = loop {
        let line = lines
            .next()
            .expect("agl serve exited before listening")
            .expect("read stderr");
        if let Some(p) = port_from(&line) {
            break p;
        }
    };
    // Keep draining stderr so the server never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    Served {
        child,
        base: format!("http://127.0.0.1:{port}"),
    }
}

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

pub async fn start_local(engine: EngineConfig, config: GatewayConfig) -> Local {
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
    let gateway = Gateway::new(store.clone(), config);
    let auth = gateway.state().auth.clone();
    let control = gateway.control();
    let metrics = gateway.state().metrics.clone();
    tokio::spawn(gateway.serve(listener, std::future::pending()));
    store
        .register_engine("e1", &engine.base_url(), "served-model")
        .await
        .expect("engine");
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
                .set_status(id, 1, RolloutStatus::Running, None)
                .await
                .expect("running");
        }
    }

    /// The chat completions URL of rollout `id`'s proxy (attempt 1, train).
    pub fn chat_url(&self, id: &str) -> String {
        format!(
            "{}/proxy/{id}/1/train/openai/v1/chat/completions",
            self.base
        )
    }
}

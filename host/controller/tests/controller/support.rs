//! A gateway + test engine + store on loopback, and a controller over them.

pub use crate::process::{pid_alive, python, repo_root, wait_until};
use std::time::Duration;

use agl_controller::{Controller, ControllerConfig, GatewayClient, LocalRunner};
use agl_gateway::GatewayConfig;
use agl_store::{Mode, NewRollout, RolloutRecord, Store};
use agl_testengine::{EngineRequest, Reply, TestEngine, TestEngineConfig};
use serde_json::Value;
use tokio::sync::oneshot;

pub const ADMIN_KEY: &str = "admin-key";

pub struct Stack {
    pub store: Store,
    pub base: String,
    pub dir: tempfile::TempDir,
    _engine: TestEngine,
}

pub struct RunningController {
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl RunningController {
    /// Graceful stop; waits until every ending is recorded.
    pub async fn stop(self) {
        let _ = self.stop.send(());
        tokio::time::timeout(Duration::from_secs(60), self.task)
            .await
            .expect("controller stops")
            .expect("controller task");
    }
}

impl Stack {
    /// The stack; its store re-queues a system failure while the attempt
    /// is at most `retries` (`[store] max_system_retries`).
    pub async fn start(
        script: impl Fn(&EngineRequest) -> Reply + Send + Sync + 'static,
        retries: u32,
    ) -> Stack {
        let engine = TestEngine::start(TestEngineConfig::default().with_script(script))
            .await
            .expect("engine");
        let dir = tempfile::tempdir().expect("tempdir");
        let config = agl_store::StoreConfig {
            max_system_retries: retries,
            ..Default::default()
        };
        let store = Store::open_config(dir.path().join("agl.db"), &config).expect("store");
        store
            .register_engine(
                &agl_store::RegisterEngine::new("e1", &engine.base_url(), "served-model")
                    .with_render(agl_store::Render::Engine),
            )
            .await
            .expect("engine");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let gateway = agl_gateway::Gateway::new(
            store.clone(),
            GatewayConfig {
                listen: addr.to_string(),
                admin_key: Some(ADMIN_KEY.into()),
                ..GatewayConfig::default()
            },
        );
        tokio::spawn(gateway.serve(listener, std::future::pending()));
        Stack {
            store,
            base: format!("http://{addr}"),
            dir,
            _engine: engine,
        }
    }

    /// Creates train rollouts with these ids and inputs; returns the ids.
    pub async fn create(&self, items: impl IntoIterator<Item = (String, Value)>) -> Vec<String> {
        let batch: Vec<NewRollout> = items
            .into_iter()
            .map(|(id, input)| NewRollout {
                id: Some(id),
                group_id: "g".into(),
                mode: Mode::Train,
                input: input.into(),
                config: Default::default(),
            })
            .collect();
        let made = self.store.create_rollouts(batch).await.expect("create");
        made.into_iter().map(|r| r.id).collect()
    }

    pub fn spawn_controller(&self, config: ControllerConfig) -> RunningController {
        let client = GatewayClient::new(&self.base, Some(ADMIN_KEY.into())).expect("client");
        let runner = LocalRunner::new(&config).expect("runner");
        let controller = Controller::new(client, runner, config);
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(controller.run(async {
            let _ = stopped.await;
        }));
        RunningController { stop, task }
    }

    pub async fn records(&self, ids: &[String]) -> Vec<RolloutRecord> {
        let mut out = Vec::new();
        for id in ids {
            out.push(self.store.get_rollout(id).await.expect("get"));
        }
        out
    }

    /// Polls until `done` holds for the rollouts' records.
    pub async fn wait_for(
        &self,
        limit: Duration,
        done: impl Fn(&[RolloutRecord]) -> bool,
        ids: &[String],
    ) {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let recs = self.records(ids).await;
            if done(&recs) {
                return;
            }
            if tokio::time::Instant::now() > deadline {
                let states: Vec<_> = recs
                    .iter()
                    .map(|r| (&r.id, r.status, r.attempt, &r.reason))
                    .collect();
                panic!("timed out waiting; states: {states:?}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub async fn wait_terminal(&self, ids: &[String], limit: Duration) {
        self.wait_for(
            limit,
            |recs| recs.iter().all(|r| r.status.is_terminal()),
            ids,
        )
        .await;
    }
}

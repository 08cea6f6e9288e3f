//! The controller with the Kubernetes runner, end to end except for the
//! cluster: the real `Controller` + `K8sRunner` + `KubeRunner`, a real
//! in-process gateway over a real SQLite store, and a MOCK Kubernetes API
//! server. No API server can run on this machine, so a small fake cluster
//! (`kube_mock`: behind `tower_test::mock` and a real `kube::Client`, as in
//! `kube_runner.rs`) plays the recorded API contract: label-filtered lists,
//! streaming watches, Job POST (409 when the name exists) and DELETE. The
//! tests drive Job and pod status changes through its watches and assert
//! the requests the runner sent and what the store recorded.

#[allow(dead_code)] // shared with the local-runner tests
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use crate::kube_mock::{Cluster, MockBody, TEMPLATE, WAIT, condition, terminated};
use crate::support::{ADMIN_KEY, Stack};
use agl_controller::kube::{KubeConfig, KubeRunner, job_name};
use agl_controller::{Controller, ControllerConfig, GatewayClient, K8sRunner, RunnerKind};
use agl_testengine::Reply;
use agl_wire::rollout::RolloutStatus;
use http::{Request, Response};
use kube::client::Body;
use serde_json::{Value, json};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

fn config(relist_secs: u64) -> ControllerConfig {
    ControllerConfig {
        runner: RunnerKind::K8s,
        concurrency: 8,
        timeout_secs: 900,
        poll_interval_ms: 50,
        shutdown_wait_secs: 1,
        kube: KubeConfig {
            namespace: "agents".into(),
            job_template: Some(TEMPLATE.into()),
            image: "registry.local/agent:1.2".into(),
            jobs_per_minute: 100,
            ttl_seconds_after_finished: 600,
            relist_secs,
        },
        ..ControllerConfig::default()
    }
}

/// A controller with the Kubernetes runner whose API client is `client`
/// of the fake cluster.
struct RunningK8s {
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
    /// The fake API server's side of this controller's client: it ends once
    /// the client (and every task using it) is gone.
    api: JoinHandle<()>,
}

async fn start(
    stack: &Stack,
    cluster: &Cluster,
    client: u8,
    config: ControllerConfig,
) -> RunningK8s {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<MockBody>>();
    let api = cluster.serve(client, handle);
    let kube = kube::Client::new(service, "default");
    let jobs = KubeRunner::new(kube, config.kube.clone()).await.unwrap();
    let runner = K8sRunner::new(jobs, config.timeout_secs);
    let gateway = GatewayClient::new(&stack.base, Some(ADMIN_KEY.into())).unwrap();
    let controller = Controller::new(gateway, runner, config);
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(controller.run(async {
        let _ = stopped.await;
    }));
    RunningK8s { stop, task, api }
}

impl RunningK8s {
    async fn stop(self) {
        let _ = self.stop.send(());
        tokio::time::timeout(WAIT, self.task)
            .await
            .expect("controller stops")
            .unwrap();
    }
}

async fn view(stack: &Stack, id: &str) -> agl_wire::api::RolloutView {
    let client = GatewayClient::new(&stack.base, Some(ADMIN_KEY.into())).unwrap();
    client.get(id).await.unwrap()
}

/// The first container's environment of a posted Job.
fn env_of(job: &Value) -> BTreeMap<String, String> {
    job["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["name"].as_str().unwrap().to_string(),
                e["value"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

/// Events of one kind and attempt, payloads parsed.
async fn events(stack: &Stack, id: &str, attempt: u32, kind: &str) -> Vec<Value> {
    let all = stack.store.list_events(id, 0, 1000).await.unwrap();
    all.iter()
        .filter(|e| e.kind == kind && e.attempt == attempt)
        .map(|e| e.payload.parse().unwrap())
        .collect()
}

async fn wait_status(stack: &Stack, id: &str, attempt: u32, status: RolloutStatus) {
    let ids = [id.to_string()];
    stack
        .wait_for(
            WAIT,
            |recs| recs[0].attempt == attempt && recs[0].status == status,
            &ids,
        )
        .await;
}

/// The attempt's one `execution` event, once recorded.
async fn wait_execution(stack: &Stack, id: &str, attempt: u32) -> Value {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let recorded = events(stack, id, attempt, "execution").await;
        if !recorded.is_empty() {
            assert_eq!(recorded.len(), 1, "{id}: {recorded:?}");
            return recorded[0].clone();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{id}: execution event"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Checks the injected agent environment of a posted Job against the
/// rollout's view at that attempt.
async fn assert_agent_env(stack: &Stack, job: &Value, id: &str, attempt: u32) {
    let r = view(stack, id).await;
    assert_eq!(r.attempt, attempt);
    let env = env_of(job);
    assert_eq!(env["OPENAI_BASE_URL"], r.proxy_base_url, "{id}");
    assert!(
        r.proxy_base_url
            .ends_with(&format!("/proxy/{id}/{attempt}/train/openai/v1")),
        "{}",
        r.proxy_base_url
    );
    assert_eq!(env["OPENAI_API_KEY"], r.token);
    assert_eq!(env["AGL_ROLLOUT_ID"], id);
    assert_eq!(env["AGL_ATTEMPT"], attempt.to_string());
    assert_eq!(
        env["AGL_EVENT_URL"],
        format!("{}/v1/rollouts/{id}/events", stack.base)
    );
    let input: Value = serde_json::from_str(&env["AGL_INPUT"]).unwrap();
    assert_eq!(input, r.input.parse().unwrap());
    assert_eq!(
        job["metadata"]["labels"]["agl.dev/attempt"],
        attempt.to_string()
    );
    assert_eq!(job["metadata"]["name"], job_name(id, attempt));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn jobs_are_launched_once_and_their_ends_recorded() {
    let stack = Stack::start(|_| Reply::text("unused"), 1).await;
    let ids = stack
        .create(["ok", "exit-3", "deadline", "oom"].map(|id| {
            (
                id.to_string(),
                json!({"task": format!("solve {id}"), "n": 1}),
            )
        }))
        .await;
    let cluster = Cluster::default();
    let ctl = start(&stack, &cluster, 1, config(5)).await;

    // 1. Each queued rollout is claimed and gets one Job with the agent's env.
    for id in &ids {
        let job = cluster.posted(&job_name(id, 1)).await;
        wait_status(&stack, id, 1, RolloutStatus::Running).await;
        assert_agent_env(&stack, &job, id, 1).await;
    }
    for id in &ids {
        assert_eq!(
            wait_execution(&stack, id, 1).await,
            json!({"job": job_name(id, 1), "runner": "k8s"})
        );
    }

    // 2. Watch events end them.
    cluster.set_pod("agl-ok-1", "Running", json!({"running": {}}));
    cluster.set_job_status("agl-ok-1", condition("Complete", "CompletionsReached"));
    // The agent's own exit code: pod first, then the Job's condition.
    cluster.set_pod("agl-exit-3-1", "Failed", terminated(3, "Error"));
    cluster.set_job_status("agl-exit-3-1", condition("Failed", "BackoffLimitExceeded"));
    cluster.set_job_status("agl-deadline-1", condition("Failed", "DeadlineExceeded"));
    cluster.set_pod("agl-oom-1", "Failed", terminated(137, "OOMKilled"));
    cluster.set_job_status("agl-oom-1", condition("Failed", "BackoffLimitExceeded"));

    wait_status(&stack, "ok", 1, RolloutStatus::Succeeded).await;
    wait_status(&stack, "exit-3", 1, RolloutStatus::Failed).await;
    let failed = stack.store.get_rollout("exit-3").await.unwrap();
    assert_eq!(failed.reason.as_deref(), Some("exit code 3"));
    assert_eq!(failed.failure, Some(agl_wire::rollout::FailureKind::Agent));
    assert_eq!(
        events(&stack, "exit-3", 1, "failure").await,
        [json!({"kind": "agent", "reason": "exit code 3"})]
    );

    // System failures are re-queued as attempt 2 and launched again.
    for (id, reason) in [("deadline", "deadline"), ("oom", "OOMKilled")] {
        let job = cluster.posted(&job_name(id, 2)).await;
        wait_status(&stack, id, 2, RolloutStatus::Running).await;
        assert_agent_env(&stack, &job, id, 2).await;
        assert_eq!(
            events(&stack, id, 1, "failure").await,
            [json!({"kind": "system", "reason": reason})]
        );
        cluster.set_job_status(
            &job_name(id, 2),
            condition("Complete", "CompletionsReached"),
        );
    }
    wait_status(&stack, "deadline", 2, RolloutStatus::Succeeded).await;
    wait_status(&stack, "oom", 2, RolloutStatus::Succeeded).await;
    ctl.stop().await;

    // Exactly one POST per attempt; no agent failure was retried.
    let posted: Vec<String> = cluster.with(|s| {
        s.posts
            .iter()
            .map(|p| p["metadata"]["name"].as_str().unwrap().to_string())
            .collect()
    });
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for name in &posted {
        *counts.entry(name).or_default() += 1;
    }
    let mut names: Vec<&str> = counts.keys().copied().collect();
    names.sort_unstable();
    assert_eq!(
        names,
        [
            "agl-deadline-1",
            "agl-deadline-2",
            "agl-exit-3-1",
            "agl-ok-1",
            "agl-oom-1",
            "agl-oom-2"
        ]
    );
    assert!(counts.values().all(|&n| n == 1), "{posted:?}");
    cluster.with(|s| {
        assert!(s.deletes.is_empty(), "{:?}", s.deletes);
        assert!(s.unexpected.is_empty(), "{:?}", s.unexpected);
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cancelling_a_rollout_deletes_its_job() {
    let stack = Stack::start(|_| Reply::text("unused"), 1).await;
    stack
        .create([("victim".to_string(), json!({"task": "t"}))])
        .await;
    let cluster = Cluster::default();
    let ctl = start(&stack, &cluster, 1, config(5)).await;
    cluster.posted("agl-victim-1").await;
    wait_status(&stack, "victim", 1, RolloutStatus::Running).await;
    cluster.set_pod("agl-victim-1", "Running", json!({"running": {}}));

    let cancelled = reqwest::Client::new()
        .post(format!("{}/v1/rollouts/victim/cancel", stack.base))
        .bearer_auth(ADMIN_KEY)
        .send()
        .await
        .unwrap();
    assert!(cancelled.status().is_success(), "{}", cancelled.status());
    cluster
        .wait("the Job's DELETE", |s| !s.deletes.is_empty())
        .await;
    ctl.stop().await;

    cluster.with(|s| {
        assert_eq!(
            s.deletes,
            [(
                "agl-victim-1".to_string(),
                json!({"propagationPolicy": "Background"})
            )]
        );
        assert!(s.jobs.is_empty());
        assert_eq!(s.posts.len(), 1, "a cancelled rollout is not relaunched");
        assert!(s.unexpected.is_empty(), "{:?}", s.unexpected);
    });
    let rec = stack.store.get_rollout("victim").await.unwrap();
    assert_eq!(rec.status, RolloutStatus::Cancelled);
    assert_eq!(rec.attempt, 1);
    assert!(events(&stack, "victim", 1, "failure").await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restarted_controller_adopts_the_running_job() {
    let stack = Stack::start(|_| Reply::text("unused"), 1).await;
    stack
        .create([("long".to_string(), json!({"task": "t"}))])
        .await;
    let cluster = Cluster::default();
    // Relists only every 300 s: each list below is the one the test expects.
    let first = start(&stack, &cluster, 1, config(300)).await;
    cluster.posted("agl-long-1").await;
    cluster.set_pod("agl-long-1", "Running", json!({"running": {}}));
    wait_execution(&stack, "long", 1).await;

    // The controller dies mid-run (no graceful drain: the Job keeps running).
    first.task.abort();
    let _ = first.task.await;
    drop(first.stop);
    tokio::time::timeout(WAIT, first.api)
        .await
        .expect("the dead controller's runner stops using the API (its watch is gone)")
        .unwrap();

    let second = start(&stack, &cluster, 2, config(300)).await;
    // The new runner's watch lists once and recovery lists once; then both
    // watches are open.
    cluster
        .wait("the second controller's lists and watches", |s| {
            let reads: Vec<&str> = s
                .reads
                .iter()
                .filter(|(c, _)| *c == 2)
                .map(|(_, r)| r.as_str())
                .collect();
            reads.iter().filter(|r| **r == "list jobs").count() == 2
                && reads.contains(&"watch jobs")
                && reads.contains(&"watch pods")
        })
        .await;
    // Adopted, not relaunched.
    assert_eq!(cluster.posts_of("agl-long-1"), 1);
    let rec = stack.store.get_rollout("long").await.unwrap();
    assert_eq!((rec.status, rec.attempt), (RolloutStatus::Running, 1));

    cluster.set_job_status("agl-long-1", condition("Complete", "CompletionsReached"));
    wait_status(&stack, "long", 1, RolloutStatus::Succeeded).await;
    second.stop().await;
    cluster.with(|s| {
        assert_eq!(s.posts.len(), 1, "no second POST for the same attempt");
        assert!(s.deletes.is_empty(), "{:?}", s.deletes);
        assert!(s.unexpected.is_empty(), "{:?}", s.unexpected);
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_graceful_stop_leaves_jobs_for_the_next_controller() {
    let stack = Stack::start(|_| Reply::text("unused"), 1).await;
    stack
        .create([("steady".to_string(), json!({"task": "t"}))])
        .await;
    let cluster = Cluster::default();
    let first = start(&stack, &cluster, 1, config(300)).await;
    cluster.posted("agl-steady-1").await;
    cluster.set_pod("agl-steady-1", "Running", json!({"running": {}}));
    wait_execution(&stack, "steady", 1).await;

    // A rolling restart: the Job keeps running, no retry is spent.
    first.stop().await;
    let rec = stack.store.get_rollout("steady").await.unwrap();
    assert_eq!((rec.status, rec.attempt), (RolloutStatus::Running, 1));
    cluster.with(|s| assert!(s.deletes.is_empty(), "{:?}", s.deletes));

    let second = start(&stack, &cluster, 2, config(300)).await;
    cluster
        .wait("the second controller's watches", |s| {
            let watching = |what: &str| s.reads.iter().any(|(c, r)| *c == 2 && r == what);
            watching("watch jobs") && watching("watch pods")
        })
        .await;
    cluster.set_job_status("agl-steady-1", condition("Complete", "CompletionsReached"));
    wait_status(&stack, "steady", 1, RolloutStatus::Succeeded).await;
    second.stop().await;
    cluster.with(|s| {
        assert_eq!(s.posts.len(), 1, "adopted, not relaunched");
        assert!(s.deletes.is_empty(), "{:?}", s.deletes);
        assert!(s.unexpected.is_empty(), "{:?}", s.unexpected);
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_job_created_just_before_a_crash_is_adopted() {
    let stack = Stack::start(|_| Reply::text("unused"), 1).await;
    stack
        .create([("early".to_string(), json!({"task": "t"}))])
        .await;
    let cluster = Cluster::default();
    // The API server creates the Job but its answer never arrives: the
    // controller dies before it can record the `execution` event.
    cluster.with(|s| s.hold_posts = true);
    let first = start(&stack, &cluster, 1, config(300)).await;
    cluster.posted("agl-early-1").await;
    first.task.abort();
    let _ = first.task.await;
    assert!(events(&stack, "early", 1, "execution").await.is_empty());
    cluster.with(|s| s.hold_posts = false);

    // The next controller finds the Job by its name instead of failing the
    // attempt and launching attempt 2 next to it.
    let second = start(&stack, &cluster, 2, config(300)).await;
    cluster
        .wait("the second controller's watches", |s| {
            let watching = |what: &str| s.reads.iter().any(|(c, r)| *c == 2 && r == what);
            watching("watch jobs") && watching("watch pods")
        })
        .await;
    cluster.set_job_status("agl-early-1", condition("Complete", "CompletionsReached"));
    wait_status(&stack, "early", 1, RolloutStatus::Succeeded).await;
    second.stop().await;
    cluster.with(|s| {
        assert_eq!(s.posts.len(), 1, "{:?}", s.posts);
        assert!(s.unexpected.is_empty(), "{:?}", s.unexpected);
    });
}

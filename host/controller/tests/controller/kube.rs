//! Contract tests of the Kubernetes runner against a MOCK API server: no
//! Kubernetes cluster can run on this machine, so each test plays the API
//! server through `tower_test::mock` behind a real `kube::Client`, asserting
//! the exact requests (method, path, query, JSON body) and answering with
//! responses shaped like the API server's.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::time::Duration;

use agl_controller::kube::{
    ExecKey, ExecState, JobSpec, JobTemplate, KubeConfig, KubeRunner, job_name,
};
use bytes::Bytes;
use futures_util::StreamExt;
use http::{Method, Request, Response};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use kube::client::Body;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tower_test::mock::{Handle, SendResponse};

type MockBody = UnsyncBoxBody<Bytes, Infallible>;
type ApiServer = Handle<Request<Body>, Response<MockBody>>;

const JOBS: &str = "/apis/batch/v1/namespaces/agents/jobs";
const PODS: &str = "/api/v1/namespaces/agents/pods";
const SELECTOR: &str = "labelSelector=agl.dev%2Fmanaged-by%3Dagl";
const GOLDEN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/kube_job.json");
const TEMPLATE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../deploy/k8s/job-template.yaml"
);

fn config() -> KubeConfig {
    KubeConfig {
        namespace: "agents".into(),
        job_template: Some(TEMPLATE.into()),
        image: "registry.local/agent:1.2".into(),
        jobs_per_minute: 100,
        ttl_seconds_after_finished: 600,
        relist_secs: 5,
    }
}

/// A sample rollout whose task tries to break out of its YAML scalar.
fn spec(rollout_id: &str, attempt: u32) -> JobSpec {
    JobSpec {
        rollout_id: rollout_id.into(),
        attempt,
        input: json!({
            "task": "fix \"it\"\nkind: Pod\n  evil: {a: 1}: # not a comment",
            "meta": {"repo": "x/y", "n": 3},
        }),
        env: BTreeMap::from([
            ("AGL_ROLLOUT_ID".to_string(), rollout_id.to_string()),
            (
                "OPENAI_BASE_URL".into(),
                format!("http://gw:8080/proxy/{rollout_id}/{attempt}/train/openai/v1"),
            ),
            ("TASK".into(), "overridden by the runner".into()),
        ]),
        timeout_secs: 1800,
    }
}

async fn runner(config: KubeConfig) -> (KubeRunner, ApiServer) {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<MockBody>>();
    let client = kube::Client::new(service, "default");
    (KubeRunner::new(client, config).await.unwrap(), handle)
}

fn respond(status: u16, body: Value) -> Response<MockBody> {
    let bytes = Bytes::from(serde_json::to_vec(&body).unwrap());
    Response::builder()
        .status(status)
        .body(Full::new(bytes).boxed_unsync())
        .unwrap()
}

/// A watch response that stays open; each sent value is one event line.
fn open_watch() -> (mpsc::UnboundedSender<Value>, Response<MockBody>) {
    let (tx, rx) = mpsc::unbounded_channel::<Value>();
    let lines = tokio_stream::wrappers::UnboundedReceiverStream::new(rx).map(|event| {
        let mut line = serde_json::to_vec(&event).unwrap();
        line.push(b'\n');
        Ok::<_, Infallible>(Frame::data(Bytes::from(line)))
    });
    (
        tx,
        Response::builder()
            .status(200)
            .body(StreamBody::new(lines).boxed_unsync())
            .unwrap(),
    )
}

/// Takes the next request, checks its method and URI, returns its JSON body.
async fn expect(
    api: &mut ApiServer,
    method: Method,
    uri: &str,
) -> (Value, SendResponse<Response<MockBody>>) {
    let (request, send) = tokio::time::timeout(Duration::from_secs(3600), api.next_request())
        .await
        .expect("a request")
        .expect("the client is alive");
    assert_eq!(
        (request.method(), request.uri().to_string().as_str()),
        (&method, uri)
    );
    let bytes = request.into_body().collect_bytes().await.unwrap();
    let body = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes).unwrap()
    };
    (body, send)
}

fn list_uri(path: &str) -> String {
    format!("{path}?&{SELECTOR}")
}

fn watch_uri(path: &str, version: &str) -> String {
    format!(
        "{path}?&watch=true&timeoutSeconds=290&{SELECTOR}&allowWatchBookmarks=true&resourceVersion={version}"
    )
}

/// A Job as the API server reports it, carrying the runner's metadata.
fn job(rollout_id: &str, attempt: u32, status: Value) -> Value {
    json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {
            "name": job_name(rollout_id, attempt), "namespace": "agents",
            "uid": format!("uid-{rollout_id}"), "resourceVersion": "41",
            "creationTimestamp": "2026-11-29T12:00:00Z",
            "labels": {"agl.dev/rollout-id": rollout_id, "agl.dev/attempt": attempt.to_string(), "agl.dev/managed-by": "agl"},
            "annotations": {"agl.dev/rollout-id": rollout_id},
        },
        "spec": {"backoffLimit": 0, "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "agent", "image": "a"}]}}},
        "status": status,
    })
}

fn condition(type_: &str, reason: &str) -> Value {
    json!({"conditions": [{"type": type_, "status": "True", "reason": reason, "message": "m",
        "lastProbeTime": "2026-11-29T12:30:00Z", "lastTransitionTime": "2026-11-29T12:30:00Z"}]})
}

/// A pod of the Job with one container in `state` (and the pod's phase).
fn pod(rollout_id: &str, attempt: u32, phase: &str, extra: Value, state: Value) -> Value {
    let mut status = json!({"phase": phase, "containerStatuses": [{
        "name": "agent", "image": "a", "imageID": "", "ready": false, "restartCount": 0, "state": state}]});
    status
        .as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": format!("{}-x7k2p", job_name(rollout_id, attempt)), "namespace": "agents",
            "labels": {"agl.dev/rollout-id": rollout_id, "agl.dev/attempt": attempt.to_string(), "agl.dev/managed-by": "agl"},
            "annotations": {"agl.dev/rollout-id": rollout_id},
        },
        "spec": {"containers": [{"name": "agent", "image": "a"}]},
        "status": status,
    })
}

fn list(kind: &str, version: &str, items: Vec<Value>) -> Value {
    json!({"apiVersion": "v1", "kind": kind, "metadata": {"resourceVersion": version}, "items": items})
}

fn status(code: u16, reason: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": format!("{reason} (mock)"), "reason": reason, "code": code})
}

fn failed(system: bool, reason: &str) -> ExecState {
    ExecState::Failed {
        system,
        reason: reason.into(),
    }
}

fn key(rollout_id: &str, attempt: u32) -> ExecKey {
    ExecKey {
        rollout_id: rollout_id.into(),
        attempt,
    }
}

#[test]
fn rendered_template_matches_the_golden_manifest() {
    let template = JobTemplate::new(&std::fs::read_to_string(TEMPLATE).unwrap()).unwrap();
    let job = template.render(&spec("Task/42", 1), &config()).unwrap();
    let rendered = serde_json::to_value(&job).unwrap();
    if std::env::var_os("AGL_BLESS").is_some() {
        std::fs::write(
            GOLDEN,
            serde_json::to_string_pretty(&rendered).unwrap() + "\n",
        )
        .unwrap();
    }
    let golden: Value = serde_json::from_str(&std::fs::read_to_string(GOLDEN).unwrap()).unwrap();
    assert_eq!(
        rendered, golden,
        "rerun with AGL_BLESS=1 after an intended change"
    );

    // The hostile task arrives verbatim as one value; no key was injected.
    let container = &rendered["spec"]["template"]["spec"]["containers"][0];
    let env: BTreeMap<&str, &Value> = container["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["name"].as_str().unwrap(), &e["value"]))
        .collect();
    assert_eq!(env["TASK"], "overridden by the runner");
    assert_eq!(env["TASK_META"], r#"{"repo":"x/y","n":3}"#);
    assert_eq!(
        container.as_object().unwrap().len(),
        5,
        "name, image, command, env, resources"
    );
    let mut hostile = spec("r1", 0);
    hostile.env.clear();
    let job = serde_json::to_value(template.render(&hostile, &config()).unwrap()).unwrap();
    let env = &job["spec"]["template"]["spec"]["containers"][0]["env"];
    assert_eq!(env[0]["value"], hostile.input["task"]);
    assert_eq!(job["kind"], "Job");
}

#[tokio::test]
async fn launch_posts_the_rendered_job_and_treats_409_as_launched() {
    let (runner, mut api) = runner(config()).await;
    let golden: Value = serde_json::from_str(&std::fs::read_to_string(GOLDEN).unwrap()).unwrap();
    let launching = tokio::spawn(async move {
        let first = runner.launch(&spec("Task/42", 1)).await;
        let again = runner.launch(&spec("Task/42", 1)).await;
        let rejected = runner.launch(&spec("Task/42", 2)).await;
        (first, again, rejected)
    });
    let (body, send) = expect(&mut api, Method::POST, &format!("{JOBS}?")).await;
    assert_eq!(body, golden);
    send.send_response(respond(201, body));
    let (body, send) = expect(&mut api, Method::POST, &format!("{JOBS}?")).await;
    assert_eq!(body, golden);
    send.send_response(respond(409, status(409, "AlreadyExists")));
    let (_, send) = expect(&mut api, Method::POST, &format!("{JOBS}?")).await;
    send.send_response(respond(422, status(422, "Invalid")));
    let (first, again, rejected) = launching.await.unwrap();
    first.unwrap();
    again.unwrap();
    assert!(rejected.unwrap_err().to_string().contains("Invalid"));
}

#[tokio::test(start_paused = true)]
async fn creations_beyond_the_per_minute_budget_wait_for_a_refill() {
    let (runner, mut api) = runner(KubeConfig {
        jobs_per_minute: 2,
        ..config()
    })
    .await;
    let start = Instant::now();
    let launching = tokio::spawn(async move {
        for n in 0..4 {
            runner.launch(&spec(&format!("r{n}"), 0)).await.unwrap();
        }
    });
    let mut arrivals = Vec::new();
    for n in 0..4 {
        let (body, send) = expect(&mut api, Method::POST, &format!("{JOBS}?")).await;
        assert_eq!(body["metadata"]["name"], format!("agl-r{n}-0"));
        arrivals.push(start.elapsed().as_secs());
        send.send_response(respond(201, body));
    }
    launching.await.unwrap();
    // Burst of two, then one every 30 s.
    assert_eq!(arrivals, [0, 0, 30, 60]);
}

#[tokio::test]
async fn cancel_deletes_the_job_in_the_background_and_tolerates_404() {
    let (runner, mut api) = runner(config()).await;
    let cancelling = tokio::spawn(async move {
        (
            runner.cancel(&key("r1", 3)).await,
            runner.cancel(&key("r1", 3)).await,
        )
    });
    let expected = json!({"propagationPolicy": "Background"});
    let (body, send) = expect(&mut api, Method::DELETE, &format!("{JOBS}/agl-r1-3?")).await;
    assert_eq!(body, expected);
    send.send_response(respond(200, status(200, "")));
    let (body, send) = expect(&mut api, Method::DELETE, &format!("{JOBS}/agl-r1-3?")).await;
    assert_eq!(body, expected);
    send.send_response(respond(404, status(404, "NotFound")));
    let (first, second) = cancelling.await.unwrap();
    first.unwrap();
    second.unwrap();
}

#[tokio::test]
async fn a_restarted_controller_adopts_jobs_by_label() {
    let (runner, mut api) = runner(config()).await;
    let listing = tokio::spawn(async move { runner.list().await.unwrap() });
    let (_, send) = expect(&mut api, Method::GET, &list_uri(JOBS)).await;
    send.send_response(respond(
        200,
        list(
            "JobList",
            "100",
            vec![
                job("r1", 0, json!({"active": 1, "ready": 1})),
                job("r2", 1, condition("Complete", "CompletionsReached")),
                job("r3", 0, json!({"active": 1})),
            ],
        ),
    ));
    let (_, send) = expect(&mut api, Method::GET, &list_uri(PODS)).await;
    let pulling = json!({"waiting": {"reason": "ErrImagePull", "message": "not found"}});
    send.send_response(respond(
        200,
        list(
            "PodList",
            "101",
            vec![pod("r3", 0, "Pending", json!({}), pulling)],
        ),
    ));
    // The Job stuck on its image is deleted; nothing is created.
    let (_, send) = expect(&mut api, Method::DELETE, &format!("{JOBS}/agl-r3-0?")).await;
    send.send_response(respond(200, status(200, "")));
    let states = listing.await.unwrap();
    assert_eq!(
        states,
        vec![
            (key("r1", 0), ExecState::Running),
            (key("r2", 1), ExecState::Succeeded),
            (
                key("r3", 0),
                failed(true, "image pull: ErrImagePull: not found")
            ),
        ]
    );
    // The runner is gone with its task: no creation (or anything else) was sent.
    assert!(api.next_request().await.is_none());
}

#[tokio::test(start_paused = true)]
async fn watch_maps_events_and_relists_after_a_dropped_watch() {
    let (runner, mut api) = runner(config()).await;
    let mut states = runner.watch();

    // Initial list: one running Job.
    let (_, send) = expect(&mut api, Method::GET, &list_uri(JOBS)).await;
    send.send_response(respond(
        200,
        list("JobList", "100", vec![job("a", 0, json!({"active": 1}))]),
    ));
    let (_, send) = expect(&mut api, Method::GET, &list_uri(PODS)).await;
    let running = pod("a", 0, "Running", json!({}), json!({"running": {}}));
    send.send_response(respond(200, list("PodList", "200", vec![running.clone()])));
    assert_eq!(
        states.next().await.unwrap(),
        (key("a", 0), ExecState::Running)
    );

    let (_, send) = expect(&mut api, Method::GET, &watch_uri(JOBS, "100")).await;
    let (jobs, response) = open_watch();
    send.send_response(response);
    let (_, send) = expect(&mut api, Method::GET, &watch_uri(PODS, "200")).await;
    let (pods, response) = open_watch();
    send.send_response(response);

    let event = |type_: &str, object: Value| json!({"type": type_, "object": object});
    // Deadline.
    jobs.send(event(
        "ADDED",
        job("b", 0, condition("Failed", "DeadlineExceeded")),
    ))
    .unwrap();
    assert_eq!(
        states.next().await.unwrap(),
        (key("b", 0), failed(true, "deadline"))
    );
    // The same state again is not reported; the agent's exit code is.
    jobs.send(event(
        "MODIFIED",
        job("b", 0, condition("Failed", "DeadlineExceeded")),
    ))
    .unwrap();
    let exited = json!({"terminated": {"exitCode": 2, "reason": "Error"}});
    jobs.send(event("ADDED", job("c", 0, json!({"active": 1}))))
        .unwrap();
    assert_eq!(
        states.next().await.unwrap(),
        (key("c", 0), ExecState::Pending)
    );
    // The Job's condition may arrive before its pod's status: the failure
    // is held back (the next report is another Job's) until the pod says why.
    jobs.send(event(
        "MODIFIED",
        job("c", 0, condition("Failed", "BackoffLimitExceeded")),
    ))
    .unwrap();
    jobs.send(event("ADDED", job("c2", 0, json!({"active": 1}))))
        .unwrap();
    assert_eq!(
        states.next().await.unwrap(),
        (key("c2", 0), ExecState::Pending)
    );
    pods.send(event("MODIFIED", pod("c", 0, "Failed", json!({}), exited)))
        .unwrap();
    assert_eq!(
        states.next().await.unwrap(),
        (key("c", 0), failed(false, "exit code 2"))
    );
    // OOM and eviction come from the pods.
    jobs.send(event("ADDED", job("d", 0, json!({"active": 1}))))
        .unwrap();
    assert_eq!(
        states.next().await.unwrap(),
        (key("d", 0), ExecState::Pending)
    );
    let oom = json!({"terminated": {"exitCode": 137, "reason": "OOMKilled"}});
    pods.send(event("MODIFIED", pod("d", 0, "Failed", json!({}), oom)))
        .unwrap();
    assert_eq!(
        states.next().await.unwrap(),
        (key("d", 0), failed(true, "OOMKilled"))
    );
    jobs.send(event("ADDED", job("e", 0, json!({"active": 1}))))
        .unwrap();
    assert_eq!(
        states.next().await.unwrap(),
        (key("e", 0), ExecState::Pending)
    );
    let evicted = json!({"reason": "Evicted", "message": "The node was low on resource: memory."});
    pods.send(event(
        "MODIFIED",
        pod(
            "e",
            0,
            "Failed",
            evicted,
            json!({"terminated": {"exitCode": 137}}),
        ),
    ))
    .unwrap();
    assert_eq!(
        states.next().await.unwrap(),
        (key("e", 0), failed(true, "evicted"))
    );
    // An image pull failure is reported and its Job deleted.
    jobs.send(event("ADDED", job("f", 0, json!({"active": 1}))))
        .unwrap();
    assert_eq!(
        states.next().await.unwrap(),
        (key("f", 0), ExecState::Pending)
    );
    let backoff =
        json!({"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image"}});
    pods.send(event(
        "MODIFIED",
        pod("f", 0, "Pending", json!({}), backoff),
    ))
    .unwrap();
    let (body, send) = expect(&mut api, Method::DELETE, &format!("{JOBS}/agl-f-0?")).await;
    assert_eq!(body, json!({"propagationPolicy": "Background"}));
    send.send_response(respond(200, status(200, "")));
    assert_eq!(
        states.next().await.unwrap(),
        (
            key("f", 0),
            failed(true, "image pull: ImagePullBackOff: Back-off pulling image")
        )
    );

    // The Job watch drops; "a" completes while no watch is open.
    drop(jobs);
    let dropped_at = Instant::now();
    let (_, send) = expect(&mut api, Method::GET, &list_uri(JOBS)).await;
    assert_eq!(
        dropped_at.elapsed(),
        Duration::from_secs(1),
        "a short pause, then a relist"
    );
    send.send_response(respond(
        200,
        list(
            "JobList",
            "300",
            vec![job("a", 0, condition("Complete", "CompletionsReached"))],
        ),
    ));
    let (_, send) = expect(&mut api, Method::GET, &list_uri(PODS)).await;
    send.send_response(respond(200, list("PodList", "301", vec![])));
    assert_eq!(
        states.next().await.unwrap(),
        (key("a", 0), ExecState::Succeeded)
    );

    // New watches start from the new list's versions; a 410 Gone relists.
    let (_, send) = expect(&mut api, Method::GET, &watch_uri(JOBS, "300")).await;
    let (jobs, response) = open_watch();
    send.send_response(response);
    let (_, send) = expect(&mut api, Method::GET, &watch_uri(PODS, "301")).await;
    let (_pods, response) = open_watch();
    send.send_response(response);
    jobs.send(json!({"type": "ERROR", "object": status(410, "Expired")}))
        .unwrap();
    let (_, send) = expect(&mut api, Method::GET, &list_uri(JOBS)).await;
    send.send_response(respond(
        200,
        list(
            "JobList",
            "400",
            vec![job("a", 0, condition("Complete", "CompletionsReached"))],
        ),
    ));
    let (_, send) = expect(&mut api, Method::GET, &list_uri(PODS)).await;
    send.send_response(respond(200, list("PodList", "401", vec![])));

    // Without events, the next relist comes after relist_secs, and an
    // unchanged state is not reported twice.
    let (_, send) = expect(&mut api, Method::GET, &watch_uri(JOBS, "400")).await;
    let (_jobs, response) = open_watch();
    send.send_response(response);
    let (_, send) = expect(&mut api, Method::GET, &watch_uri(PODS, "401")).await;
    let (_pods, response) = open_watch();
    send.send_response(response);
    let watching_since = Instant::now();
    let (_, send) = expect(&mut api, Method::GET, &list_uri(JOBS)).await;
    assert_eq!(watching_since.elapsed(), Duration::from_secs(5));
    let g = job("g", 0, condition("Complete", "CompletionsReached"));
    send.send_response(respond(
        200,
        list(
            "JobList",
            "500",
            vec![job("a", 0, condition("Complete", "x")), g],
        ),
    ));
    let (_, send) = expect(&mut api, Method::GET, &list_uri(PODS)).await;
    send.send_response(respond(200, list("PodList", "501", vec![running])));
    assert_eq!(
        states.next().await.unwrap(),
        (key("g", 0), ExecState::Succeeded)
    );
}

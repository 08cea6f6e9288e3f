//! A fake Kubernetes API server for the runner's tests: no cluster can run
//! on this machine, so this plays the API contract the runner relies on
//! (label-filtered lists, streaming watches, Job POST with 409 on an
//! existing name, DELETE) over `tower_test::mock` behind a real
//! `kube::Client`, keeps the Jobs and pods, and records every request.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use http::{Method, Request, Response};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use kube::client::Body;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tower_test::mock::Handle;

pub type MockBody = UnsyncBoxBody<Bytes, Infallible>;
pub type ApiServer = Handle<Request<Body>, Response<MockBody>>;

pub const JOBS: &str = "/apis/batch/v1/namespaces/agents/jobs";
pub const PODS: &str = "/api/v1/namespaces/agents/pods";
pub const SELECTOR: &str = "labelSelector=agl.dev%2Fmanaged-by%3Dagl";
pub const TEMPLATE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../deploy/k8s/job-template.yaml"
);
pub const WAIT: Duration = Duration::from_secs(20);

/// The fake cluster's objects and what each client asked of it.
#[derive(Default)]
pub struct State {
    pub jobs: BTreeMap<String, Value>,
    pub pods: BTreeMap<String, Value>,
    pub version: u64,
    /// Created Job manifests, in order.
    pub posts: Vec<Value>,
    /// Deleted Job names with the DELETE body.
    pub deletes: Vec<(String, Value)>,
    /// `(client, "list jobs" | "watch pods" | ...)` per read.
    pub reads: Vec<(u8, String)>,
    pub job_watches: Vec<mpsc::UnboundedSender<Value>>,
    pub pod_watches: Vec<mpsc::UnboundedSender<Value>>,
    /// While set, a POST creates its Job but is never answered (the client
    /// dies waiting, as in a crash between create and record).
    pub hold_posts: bool,
    /// Requests outside the contract; must stay empty.
    pub unexpected: Vec<String>,
}

#[derive(Default, Clone)]
pub struct Cluster(Arc<Mutex<State>>);

impl Cluster {
    /// Answers one client's requests until every clone of that client is gone.
    pub fn serve(&self, client: u8, mut api: ApiServer) -> JoinHandle<()> {
        let cluster = self.clone();
        tokio::spawn(async move {
            while let Some((request, send)) = api.next_request().await {
                let cluster = cluster.clone();
                tokio::spawn(async move {
                    match cluster.answer(client, request).await {
                        Some(response) => send.send_response(response),
                        None => std::future::pending().await,
                    }
                });
            }
        })
    }

    async fn answer(&self, client: u8, request: Request<Body>) -> Option<Response<MockBody>> {
        let method = request.method().clone();
        let path = request.uri().path().to_string();
        let query = request.uri().query().unwrap_or("").to_string();
        let bytes = request.into_body().collect_bytes().await.unwrap();
        let body: Value = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).unwrap()
        };
        let mut s = self.0.lock().unwrap();
        s.version += 1;
        let version = s.version.to_string();
        let kind = match path.as_str() {
            JOBS => "jobs",
            PODS => "pods",
            _ => "",
        };
        let response = match method {
            Method::GET if !kind.is_empty() && query.contains(SELECTOR) => {
                if query.contains("watch=true") {
                    s.reads.push((client, format!("watch {kind}")));
                    let (tx, response) = open_watch();
                    match kind {
                        "jobs" => s.job_watches.push(tx),
                        _ => s.pod_watches.push(tx),
                    }
                    return Some(response);
                }
                s.reads.push((client, format!("list {kind}")));
                let (list_kind, items) = match kind {
                    "jobs" => ("JobList", s.jobs.values().cloned().collect()),
                    _ => ("PodList", s.pods.values().cloned().collect::<Vec<_>>()),
                };
                respond(
                    200,
                    json!({"apiVersion": "v1", "kind": list_kind,
                        "metadata": {"resourceVersion": version}, "items": items}),
                )
            }
            Method::POST if kind == "jobs" => {
                let name = body["metadata"]["name"].as_str().unwrap().to_string();
                s.posts.push(body.clone());
                if s.jobs.contains_key(&name) {
                    return Some(respond(409, status(409, "AlreadyExists")));
                }
                let mut job = body;
                job["metadata"]["resourceVersion"] = json!(version);
                job["metadata"]["uid"] = json!(format!("uid-{name}"));
                job["metadata"]["creationTimestamp"] = json!("2026-11-29T12:00:00Z");
                job["status"] = json!({"active": 1});
                s.jobs.insert(name, job.clone());
                broadcast(&mut s.job_watches, "ADDED", &job);
                if s.hold_posts {
                    return None;
                }
                respond(201, job)
            }
            Method::DELETE if path.starts_with(&format!("{JOBS}/")) => {
                let name = path[JOBS.len() + 1..].to_string();
                s.deletes.push((name.clone(), body));
                match s.jobs.remove(&name) {
                    Some(job) => {
                        broadcast(&mut s.job_watches, "DELETED", &job);
                        respond(200, status(200, "Success"))
                    }
                    None => respond(404, status(404, "NotFound")),
                }
            }
            _ => {
                s.unexpected.push(format!("{method} {path}?{query}"));
                respond(500, status(500, "InternalError"))
            }
        };
        Some(response)
    }

    pub fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        f(&mut self.0.lock().unwrap())
    }

    /// Waits until `cond` holds for the cluster's state.
    pub async fn wait(&self, what: &str, cond: impl Fn(&State) -> bool) {
        let deadline = tokio::time::Instant::now() + WAIT;
        while !self.with(|s| cond(s)) {
            assert!(tokio::time::Instant::now() < deadline, "waiting for {what}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The created manifest of Job `name` (waits for its POST).
    pub async fn posted(&self, name: &str) -> Value {
        self.wait(&format!("POST {name}"), |s| {
            s.posts.iter().any(|p| p["metadata"]["name"] == name)
        })
        .await;
        self.with(|s| {
            s.posts
                .iter()
                .find(|p| p["metadata"]["name"] == name)
                .cloned()
                .unwrap()
        })
    }

    /// The API server updates a Job's status, seen by every Job watch.
    pub fn set_job_status(&self, name: &str, job_status: Value) {
        self.with(|s| {
            s.version += 1;
            let version = s.version.to_string();
            let job = s.jobs.get_mut(name).unwrap();
            job["status"] = job_status;
            job["metadata"]["resourceVersion"] = json!(version);
            let job = job.clone();
            broadcast(&mut s.job_watches, "MODIFIED", &job);
        });
    }

    /// The Job's pod (labelled like its Job) now has one container in `state`.
    pub fn set_pod(&self, job: &str, phase: &str, state: Value) {
        self.with(|s| {
            let meta = &s.jobs[job]["spec"]["template"]["metadata"];
            let name = format!("{job}-x7k2p");
            let pod = json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": "agents",
                    "labels": meta["labels"], "annotations": meta["annotations"]},
                "spec": {"containers": [{"name": "agent", "image": "a"}]},
                "status": {"phase": phase, "containerStatuses": [{"name": "agent",
                    "image": "a", "imageID": "", "ready": false, "restartCount": 0,
                    "state": state}]},
            });
            let event = if s.pods.contains_key(&name) {
                "MODIFIED"
            } else {
                "ADDED"
            };
            s.pods.insert(name, pod.clone());
            broadcast(&mut s.pod_watches, event, &pod);
        });
    }

    pub fn posts_of(&self, name: &str) -> usize {
        self.with(|s| {
            s.posts
                .iter()
                .filter(|p| p["metadata"]["name"] == name)
                .count()
        })
    }
}

fn broadcast(watches: &mut Vec<mpsc::UnboundedSender<Value>>, type_: &str, object: &Value) {
    let event = json!({"type": type_, "object": object});
    watches.retain(|tx| tx.send(event.clone()).is_ok());
}

fn respond(code: u16, body: Value) -> Response<MockBody> {
    let bytes = Bytes::from(serde_json::to_vec(&body).unwrap());
    Response::builder()
        .status(code)
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
    let response = Response::builder()
        .status(200)
        .body(StreamBody::new(lines).boxed_unsync())
        .unwrap();
    (tx, response)
}

pub fn status(code: u16, reason: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": format!("{reason} (mock)"), "reason": reason, "code": code})
}

pub fn condition(type_: &str, reason: &str) -> Value {
    json!({"conditions": [{"type": type_, "status": "True", "reason": reason, "message": "m",
        "lastProbeTime": "2026-11-29T12:30:00Z", "lastTransitionTime": "2026-11-29T12:30:00Z"}]})
}

pub fn terminated(code: i32, reason: &str) -> Value {
    json!({"terminated": {"exitCode": code, "reason": reason}})
}

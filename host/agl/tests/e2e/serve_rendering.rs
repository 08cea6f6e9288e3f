//! `agl serve` renders, as a user deploys it: the real binaries, `agl serve`
//! with a config naming the SmolLM2 folder (its own policy) and `agl engine
//! serve` on the same folder, the engine registered over the management
//! API with `render = "gateway"` (its context read from the engine's
//! `/v1/models`). The anthropic SDK (create + stream + count_tokens), the
//! OpenAI Responses API (create + streamed `previous_response_id`) and the
//! real Claude Code and Codex CLIs are served: every call recorded with the
//! ids the engine saw and sampled, each follow-up naming the call it
//! continues; after a restart of `agl serve` the chain goes on; a context
//! that leaves no room is the API's context-length error. Registration
//! without a policy to render with is refused, naming what is missing.

use std::path::Path;
use std::process::{Child, Command};

use serde_json::{Value, json};

use crate::engine_server::smollm2_dir;
use crate::process::node_cli;
use crate::support::{
    ADMIN, AGL, python, python_json, repo_root, spawn_listening, spawn_serve_with,
};

/// A running `agl engine serve`; killed when dropped.
struct EngineServe(Child, String);

impl Drop for EngineServe {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn engine_serve(model: &Path) -> EngineServe {
    let mut cmd = Command::new(AGL);
    cmd.args(["engine", "serve", "--listen", "127.0.0.1:0"])
        .args([
            "--served-model-name",
            "smollm2",
            "--max-len",
            "2048",
            "--model",
        ])
        .arg(model);
    let (child, port) = spawn_listening(&mut cmd);
    EngineServe(child, format!("http://127.0.0.1:{port}"))
}

struct Admin {
    http: reqwest::Client,
    base: String,
}

impl Admin {
    async fn send(&self, req: reqwest::RequestBuilder) -> (u16, Value) {
        let resp = req.bearer_auth(ADMIN).send().await.expect("send");
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        let req = self.http.post(format!("{}{path}", self.base)).json(&body);
        self.send(req).await
    }

    /// Creates val (greedy) rollout `id` and marks it running: its view
    /// (URLs, token).
    async fn running(&self, id: &str) -> Value {
        let (s, created) = self
            .post(
                "/v1/rollouts",
                json!({"rollouts": [{"rollout_id": id, "mode": "val", "input": {}}]}),
            )
            .await;
        assert_eq!(s, 200, "{created}");
        let patch = self
            .http
            .patch(format!("{}/v1/rollouts/{id}", self.base))
            .json(&json!({"attempt": 1, "status": "running"}));
        let (s, body) = self.send(patch).await;
        assert_eq!(s, 200, "{body}");
        created["rollouts"][0].clone()
    }

    /// The rollout's recorded calls: (seq, payload).
    async fn calls(&self, id: &str) -> Vec<(u64, Value)> {
        let req = self
            .http
            .get(format!("{}/v1/rollouts/{id}/events", self.base));
        let (s, body) = self.send(req).await;
        assert_eq!(s, 200, "{body}");
        body["events"]
            .as_array()
            .expect("events")
            .iter()
            .filter(|e| e["kind"] == "model_request" && e["superseded_by"].is_null())
            .map(|e| (e["seq"].as_u64().expect("seq"), e["payload"].clone()))
            .collect()
    }
}

/// Every call holds prompt and sampled ids; `chain` lists which calls
/// continue which (indexes into the calls).
fn assert_recorded(calls: &[(u64, Value)], chain: &[(usize, usize)], what: &str) {
    assert!(!calls.is_empty(), "{what}: no call recorded");
    for (seq, c) in calls {
        let ids = |k: &str| c[k].as_array().map_or(0, Vec::len);
        assert!(
            ids("prompt_ids") > 0,
            "{what} call {seq}: no prompt ids: {c}"
        );
        assert!(
            ids("response_ids") > 0,
            "{what} call {seq}: no sampled ids: {c}"
        );
        assert_eq!(
            ids("response_ids"),
            ids("response_logprobs"),
            "{what} call {seq}"
        );
    }
    for &(later, earlier) in chain {
        assert_eq!(
            calls[later].1["continues"],
            json!(calls[earlier].0),
            "{what}: call {later} continues call {earlier}"
        );
        // Token-exact: the later prompt starts with the earlier prompt and
        // what was sampled.
        let ids = |c: &Value, k: &str| -> Vec<u64> {
            c[k].as_array()
                .expect("ids")
                .iter()
                .map(|v| v.as_u64().expect("id"))
                .collect()
        };
        let (e, l) = (&calls[earlier].1, &calls[later].1);
        let prefix = [ids(e, "prompt_ids"), ids(e, "response_ids")].concat();
        assert_eq!(&ids(l, "prompt_ids")[..prefix.len()], &prefix[..], "{what}");
    }
}

async fn run_output(mut cmd: Command) -> std::process::Output {
    tokio::task::spawn_blocking(move || cmd.output().expect("run"))
        .await
        .expect("join")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agl_serve_renders_for_the_sdks_and_the_coding_clis() {
    let model = smollm2_dir();
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("agl.toml");
    // Answers capped short: this is about serving, not about the answers.
    let toml = format!(
        "[model]\npath = {:?}\n[gateway]\nmax_tokens = 256\n",
        model.display().to_string()
    );
    std::fs::write(&config, toml).expect("config");
    let db = dir.path().join("agl.db");
    let engine = engine_serve(&model);
    let mut served = spawn_serve_with(&db, Some(&config));
    let admin = Admin {
        http: reqwest::Client::new(),
        base: served.base.clone(),
    };
    let (s, registered) = admin
        .post(
            "/v1/engines",
            json!({"name": "smol", "base_url": engine.1, "model": "smollm2", "render": "gateway"}),
        )
        .await;
    assert_eq!(s, 200, "{registered}");
    // The gateway's own policy (none named), the context the engine reports.
    assert_eq!(registered["render"], "gateway");
    assert_eq!(registered["policy"], Value::Null);
    assert_eq!(registered["context_len"], 2048, "{registered}");

    // The anthropic SDK: create, then streamed, then counted.
    let view = admin.running("msg").await;
    let mut cmd = Command::new(python());
    cmd.arg(repo_root().join("tests/python/serve_clients.py"));
    cmd.arg("messages")
        .env(
            "ANTHROPIC_BASE_URL",
            view["anthropic_base_url"].as_str().expect("url"),
        )
        .env("ANTHROPIC_API_KEY", view["token"].as_str().expect("token"));
    let got = python_json(cmd).await;
    let msg_history = got["history"].clone();
    assert!(
        got["events"]
            .as_array()
            .expect("events")
            .contains(&json!("message_stop")),
        "{got}"
    );
    let calls = admin.calls("msg").await;
    assert_eq!(calls.len(), 2, "{got}");
    assert_recorded(&calls, &[(1, 0)], "messages");
    // count_tokens renders the next prompt as the chain continues it.
    let next = calls[1].1["prompt_ids"].as_array().map_or(0, Vec::len)
        + calls[1].1["response_ids"].as_array().map_or(0, Vec::len);
    assert!(
        got["counted"].as_u64().expect("counted") as usize > next,
        "{got}"
    );

    // OpenAI Responses: create, then a streamed follow-up by
    // previous_response_id.
    let view = admin.running("resp").await;
    let mut cmd = Command::new(python());
    cmd.arg(repo_root().join("tests/python/serve_clients.py"));
    cmd.arg("responses")
        .env(
            "OPENAI_BASE_URL",
            view["proxy_base_url"].as_str().expect("url"),
        )
        .env("OPENAI_API_KEY", view["token"].as_str().expect("token"));
    let got = python_json(cmd).await;
    assert_eq!(got["second"]["status"], "completed", "{got}");
    let calls = admin.calls("resp").await;
    assert_eq!(calls.len(), 2, "{got}");
    assert_recorded(&calls, &[(1, 0)], "responses");

    // The real Claude Code CLI, its prompt kept small for a 135M policy.
    let view = admin.running("claude").await;
    let work = dir.path().join("claude");
    std::fs::create_dir_all(work.join(".home")).expect("home");
    let mut cmd = Command::new(node_cli("claude"));
    cmd.args([
        "-p",
        "Say only: hi",
        "--system-prompt",
        "Answer in one word.",
    ])
    .args(["--bare", "--tools", "Bash", "--max-turns", "1"])
    .current_dir(&work)
    .env("HOME", work.join(".home"))
    .env(
        "ANTHROPIC_BASE_URL",
        view["anthropic_base_url"].as_str().expect("url"),
    )
    .env("ANTHROPIC_API_KEY", view["token"].as_str().expect("token"))
    .env("ANTHROPIC_MODEL", "smollm2")
    .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
    .env("DISABLE_TELEMETRY", "1");
    let out = run_output(cmd).await;
    let calls = admin.calls("claude").await;
    let why = format!("{out:?}");
    assert!(out.status.success(), "{why}");
    assert_recorded(&calls, &[], &format!("claude code: {why}"));
    assert_eq!(calls[0].1["api"], "anthropic_messages");

    // The real Codex CLI over streamed Responses, its instructions replaced.
    let view = admin.running("codex").await;
    let work = dir.path().join("codex");
    let home = work.join(".codex");
    std::fs::create_dir_all(&home).expect("home");
    std::fs::write(home.join("instructions.md"), "Answer in one word.").expect("instructions");
    let codex_config = format!(
        "model = \"smollm2\"\nmodel_provider = \"agl\"\nmodel_instructions_file = {:?}\n\
         [model_providers.agl]\nname = \"agl\"\nbase_url = {:?}\nenv_key = \"AGL_ROLLOUT_TOKEN\"\n\
         wire_api = \"responses\"\nrequest_max_retries = 0\nstream_max_retries = 0\n",
        home.join("instructions.md").display().to_string(),
        view["proxy_base_url"].as_str().expect("url"),
    );
    std::fs::write(home.join("config.toml"), codex_config).expect("codex config");
    let mut cmd = Command::new(node_cli("codex"));
    cmd.args(["exec", "--skip-git-repo-check", "--json", "Say only: hi"])
        .current_dir(&work)
        .env("HOME", &work)
        .env("CODEX_HOME", &home)
        .env("AGL_ROLLOUT_TOKEN", view["token"].as_str().expect("token"));
    let out = run_output(cmd).await;
    let calls = admin.calls("codex").await;
    let why = format!("{out:?}");
    // Codex got the answer streamed as an item. A 135M policy may not stop
    // within the gateway's cap (`gateway.max_tokens`): the response is then
    // `incomplete` (max_output_tokens), which Codex reports and exits on.
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("\"agent_message\""), "{why}");
    assert!(
        out.status.success() || stdout.contains("reason: max_output_tokens"),
        "{why}"
    );
    assert_recorded(&calls, &[], &format!("codex: {why}"));
    assert_eq!(calls[0].1["api"], "responses");

    // A restart: the Messages chain is rebuilt from the store and goes on.
    let _ = served.child.kill();
    let _ = served.child.wait();
    let served = spawn_serve_with(&db, Some(&config));
    let admin = Admin {
        http: reqwest::Client::new(),
        base: served.base.clone(),
    };
    let third = admin
        .http
        .post(format!(
            "{}/proxy/msg/1/val/anthropic/v1/messages",
            admin.base
        ))
        .bearer_auth(ADMIN)
        .json(&json!({"model": "smollm2", "max_tokens": 48, "messages": msg_history}))
        .send()
        .await
        .expect("send");
    assert_eq!(third.status(), 200, "{:?}", third.text().await);
    let calls = admin.calls("msg").await;
    assert_eq!(calls.len(), 3);
    assert_recorded(&calls, &[(1, 0), (2, 1)], "messages after a restart");

    // A context that leaves no room: each API's context-length error.
    let (s, _) = admin
        .post(
            "/v1/engines",
            json!({"name": "smol", "base_url": engine.1, "model": "smollm2",
                   "render": "gateway", "context_len": 16}),
        )
        .await;
    assert_eq!(s, 200);
    admin.running("long").await;
    let (s, err) = admin
        .post(
            "/proxy/long/1/val/openai/v1/chat/completions",
            json!({"model": "smollm2", "messages": [{"role": "user",
                   "content": "Tell me about the history of the Roman empire in detail."}]}),
        )
        .await;
    assert_eq!(s, 400, "{err}");
    assert_eq!(err["error"]["code"], "context_length_exceeded", "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_rendering_without_a_policy_is_refused_at_registration() {
    let model = smollm2_dir();
    let dir = tempfile::tempdir().expect("tempdir");
    // No config: this gateway has no policy of its own.
    let served = spawn_serve_with(&dir.path().join("agl.db"), None);
    let admin = Admin {
        http: reqwest::Client::new(),
        base: served.base.clone(),
    };
    // Nothing answers at this URL: the context stays unknown.
    let engine = json!({"name": "e", "base_url": "http://127.0.0.1:9", "model": "m"});
    let with = |extra: Value| {
        let mut body = engine.clone();
        body.as_object_mut()
            .expect("object")
            .extend(extra.as_object().expect("object").clone());
        body
    };
    let (s, err) = admin
        .post("/v1/engines", with(json!({"render": "gateway"})))
        .await;
    assert_eq!(s, 400, "{err}");
    let message = err["error"]["message"].as_str().expect("message");
    assert!(
        message.contains("`policy`") && message.contains("model.path"),
        "{message}"
    );
    let (s, err) = admin
        .post(
            "/v1/engines",
            with(json!({"render": "gateway", "policy": dir.path().join("nothing")})),
        )
        .await;
    assert_eq!(s, 400, "{err}");
    let (s, err) = admin
        .post(
            "/v1/engines",
            with(json!({"render": "engine", "policy": model})),
        )
        .await;
    assert_eq!(s, 400, "{err}");
    // Naming its own policy folder: registered, the path made absolute.
    let (s, ok) = admin
        .post(
            "/v1/engines",
            with(json!({"render": "gateway", "policy": model, "context_len": 2048})),
        )
        .await;
    assert_eq!(s, 200, "{ok}");
    let canonical = model.canonicalize().expect("canonical");
    assert_eq!(ok["policy"], json!(canonical.display().to_string()));
    assert_eq!(ok["context_len"], 2048);
}

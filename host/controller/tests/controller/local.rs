//! The controller with the local runner: real agent subprocesses, a real
//! gateway and test engine on loopback, a real SQLite store.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use crate::support::{Stack, pid_alive, python, repo_root, wait_until};
use agl_controller::{CommandSpec, ControllerConfig};
use agl_testengine::{Endpoint, EngineRequest, Reply, tokens};
use agl_wire::rollout::FailureKind;
use agl_wire::rollout::RolloutStatus;
use serde_json::{Value, json};

fn config(stack: &Stack, command: CommandSpec) -> ControllerConfig {
    ControllerConfig {
        command: Some(command),
        logs_dir: Some(stack.dir.path().join("logs")),
        workdir: Some(stack.dir.path().to_path_buf()),
        concurrency: 4,
        timeout_secs: 60,
        kill_grace_secs: 1,
        poll_interval_ms: 50,
        shutdown_wait_secs: 5,
        ..ControllerConfig::default()
    }
}

fn sh(script: &str) -> CommandSpec {
    CommandSpec::Shell(script.to_string())
}

/// The calc model: a `CALC` call for the question's expression (the calc
/// agent's text protocol), then the tool's result as the answer.
fn calc_script(r: &EngineRequest) -> Reply {
    assert_eq!(r.endpoint, Endpoint::Chat);
    let messages = r.body()["messages"].as_array().cloned().unwrap_or_default();
    let last = messages.last().cloned().unwrap_or(Value::Null);
    let content = last["content"].as_str().unwrap_or("");
    if let Some(result) = content.strip_prefix("RESULT ") {
        // `RESULT 58 * 16 = 928`: the value after the `=`.
        return Reply::text(answer(result.rsplit("= ").next().unwrap_or(result)));
    }
    Reply::text(call(content))
}

fn call(question: &str) -> String {
    let expr = question
        .trim_start_matches("What is ")
        .trim_end_matches('?');
    format!("CALC {expr}")
}

/// Short: the agent asks for at most 24 tokens (one per byte here).
fn answer(value: &str) -> String {
    format!("Answer: {value}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn calc_agent_runs_through_the_gateway_and_reports_its_reward() {
    let stack = Stack::start(calc_script, 0).await;
    let data = std::fs::read_to_string(repo_root().join("examples/calc/data.jsonl")).unwrap();
    let mut rows: Vec<Value> = data
        .lines()
        .take(4)
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    // The model computes the right number; a wrong expected answer scores 0.
    rows[3]["answer"] = json!(-12345);
    let ids = stack
        .create(
            rows.iter()
                .map(|r| (r["id"].as_str().unwrap().to_string(), r.clone())),
        )
        .await;

    let agent = repo_root().join("examples/calc/agent.py");
    let command = CommandSpec::Argv(vec![
        python().display().to_string(),
        agent.display().to_string(),
    ]);
    let ctl = stack.spawn_controller(config(&stack, command));
    stack.wait_terminal(&ids, Duration::from_secs(120)).await;
    ctl.stop().await;

    for (i, id) in ids.iter().enumerate() {
        let rec = stack.store.get_rollout(id).await.unwrap();
        let out = stack.store.export_rollout(id).await.unwrap();
        assert_eq!(
            rec.status,
            RolloutStatus::Succeeded,
            "{id}: {:?} {:?}",
            rec.reason,
            out.events
        );
        assert_eq!(out.calls.len(), 2, "{id}: a tool call, then the answer");
        let question = rows[i]["question"].as_str().unwrap();
        assert_eq!(out.calls[0].response_ids, tokens::encode(&call(question)));
        let result = original_answer(&rows[i]);
        assert_eq!(out.calls[1].response_ids, tokens::encode(&answer(&result)));
        let tool_calls = out.events.iter().filter(|e| e.kind == "tool_call").count();
        assert_eq!(tool_calls, 1, "{id}: the agent reports its tool use");
        let rewards = out.events.iter().filter(|e| e.kind == "reward").count();
        assert_eq!(rewards, 1, "{id}: one reward event");
        let reward = out
            .events
            .iter()
            .find(|e| e.kind == "reward")
            .unwrap()
            .payload
            .parse()
            .unwrap();
        let want = if i == 3 { 0.0 } else { 1.0 };
        assert_eq!(reward["value"], json!(want), "{id}: {reward}");
        assert!(out.events.iter().any(|e| e.kind == "execution"), "{id}");
        assert!(
            out.events.iter().any(|e| e.kind == "stdout"),
            "{id}: stdout tail"
        );
    }
}

/// The calculator's result for a data row: its answer as checked in.
fn original_answer(row: &Value) -> String {
    let data = std::fs::read_to_string(repo_root().join("examples/calc/data.jsonl")).unwrap();
    let orig: Value = data
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|r| r["id"] == row["id"])
        .unwrap();
    orig["answer"].to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_hundred_rollouts_at_concurrency_16_each_run_exactly_once() {
    let stack = Stack::start(|_| Reply::text("unused"), 2).await;
    let log = stack.dir.path().join("runs.log");
    let ids = stack
        .create((0..200).map(|i| {
            (
                format!("many-{i:03}"),
                json!({"question": format!("q{i}"), "fail": i % 10 == 7}),
            )
        }))
        .await;
    // One line per execution; every tenth agent fails on purpose.
    let script = format!(
        "echo \"$AGL_ROLLOUT_ID $AGL_ATTEMPT $QUESTION\" >> {log}; \
         case \"$AGL_INPUT\" in *'\"fail\":true'*) echo bad input >&2; exit 3;; esac",
        log = log.display()
    );
    let mut cfg = config(&stack, sh(&script));
    cfg.concurrency = 16;
    cfg.env_map = BTreeMap::from([("QUESTION".to_string(), "input.question".to_string())]);
    let ctl = stack.spawn_controller(cfg);
    stack.wait_terminal(&ids, Duration::from_secs(180)).await;
    ctl.stop().await;

    let lines = std::fs::read_to_string(&log).unwrap();
    let mut runs: HashMap<(String, u32), usize> = HashMap::new();
    for line in lines.lines() {
        let parts: Vec<&str> = line.split(' ').collect();
        let i: usize = parts[0].trim_start_matches("many-").parse().unwrap();
        assert_eq!(
            parts[2],
            format!("q{i}"),
            "QUESTION is mapped from the input"
        );
        *runs
            .entry((parts[0].to_string(), parts[1].parse().unwrap()))
            .or_default() += 1;
    }
    assert_eq!(runs.len(), 200, "every rollout ran");
    assert!(runs.values().all(|&n| n == 1), "no attempt ran twice");
    for (i, id) in ids.iter().enumerate() {
        let rec = stack.store.get_rollout(id).await.unwrap();
        let out = stack.store.export_rollout(id).await.unwrap();
        let executions = out.events.iter().filter(|e| e.kind == "execution").count();
        assert_eq!(executions, 1, "{id}");
        assert_eq!(rec.attempt, 1, "{id}: agent failures are not retried");
        if i % 10 == 7 {
            assert_eq!(rec.status, RolloutStatus::Failed, "{id}");
            assert_eq!(rec.reason.as_deref(), Some("exit code 3"));
            assert_eq!(rec.failure, Some(FailureKind::Agent));
            let failure = out
                .events
                .iter()
                .find(|e| e.kind == "failure")
                .unwrap()
                .payload
                .parse()
                .unwrap();
            assert_eq!(failure, json!({"kind": "agent", "reason": "exit code 3"}));
            let stderr = out
                .events
                .iter()
                .find(|e| e.kind == "stderr")
                .unwrap()
                .payload
                .parse()
                .unwrap();
            assert_eq!(stderr["tail"], "bad input\n");
        } else {
            assert_eq!(
                rec.status,
                RolloutStatus::Succeeded,
                "{id}: {:?}",
                rec.reason
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hanging_agent_is_killed_at_its_timeout_with_its_whole_group() {
    let stack = Stack::start(|_| Reply::text("unused"), 0).await;
    let ids = stack.create([("hang".to_string(), json!({}))]).await;
    let pids = stack.dir.path().join("pids");
    // Both ignore SIGTERM, so only the SIGKILL after the grace period ends them.
    let script = format!(
        "trap '' TERM; sleep 1000 & echo \"$$ $!\" > {pids}; sleep 1000",
        pids = pids.display()
    );
    let mut cfg = config(&stack, sh(&script));
    cfg.timeout_secs = 1;
    let ctl = stack.spawn_controller(cfg);
    stack.wait_terminal(&ids, Duration::from_secs(30)).await;
    ctl.stop().await;

    let rec = stack.store.get_rollout("hang").await.unwrap();
    assert_eq!(rec.status, RolloutStatus::Failed);
    assert_eq!(rec.reason.as_deref(), Some("timed out after 1s"));
    assert_eq!(rec.failure, Some(FailureKind::System));
    let out = stack.store.export_rollout("hang").await.unwrap();
    let failure = out
        .events
        .iter()
        .find(|e| e.kind == "failure")
        .unwrap()
        .payload
        .parse()
        .unwrap();
    assert_eq!(failure["kind"], "system");
    let text = std::fs::read_to_string(&pids).unwrap();
    let both: Vec<u32> = text
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();
    assert_eq!(both.len(), 2);
    wait_until(Duration::from_secs(5), || {
        both.iter().all(|&p| !pid_alive(p))
    })
    .await;
    for pid in both {
        assert!(!pid_alive(pid), "pid {pid} outlived its timeout");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_crash_is_a_system_failure_retried_as_a_new_attempt() {
    let stack = Stack::start(|_| Reply::text("unused"), 1).await;
    let ids = stack
        .create([
            ("crash".to_string(), json!({})),
            ("tempfail".to_string(), json!({})),
            ("nospawn".to_string(), json!({"bin": "/nonexistent/agent"})),
        ])
        .await;
    // Attempt 1 of `crash` dies by SIGSEGV; attempt 2 succeeds. `nospawn`
    // names a binary that does not exist.
    let script = "case \"$AGL_ROLLOUT_ID/$AGL_ATTEMPT\" in \
                  crash/1) echo 'segfault ahead' >&2; kill -SEGV $$;; \
                  tempfail/*) exit \"$AGL_SYSTEM_FAILURE_EXIT_CODE\";; \
                  esac; echo fine";
    let command = CommandSpec::Argv(vec![
        "{{ input.bin | default('sh') }}".into(),
        "-c".into(),
        script.into(),
    ]);
    let cfg = config(&stack, command);
    let ctl = stack.spawn_controller(cfg);
    stack
        .wait_for(
            Duration::from_secs(30),
            |recs| {
                recs.iter()
                    .all(|r| r.attempt == 2 && r.status.is_terminal())
            },
            &ids,
        )
        .await;
    ctl.stop().await;

    let crash = stack.store.get_rollout("crash").await.unwrap();
    assert_eq!(crash.status, RolloutStatus::Succeeded);
    let events = stack.store.list_events("crash", 0, 1000).await.unwrap();
    let first: Vec<_> = events.iter().filter(|e| e.attempt == 1).collect();
    let failure = first
        .iter()
        .find(|e| e.kind == "failure")
        .unwrap()
        .payload
        .parse()
        .unwrap();
    assert_eq!(
        failure,
        json!({"kind": "system", "reason": "killed by signal 11"})
    );
    let stderr = first
        .iter()
        .find(|e| e.kind == "stderr")
        .unwrap()
        .payload
        .parse()
        .unwrap();
    assert_eq!(stderr["tail"], "segfault ahead\n");
    assert!(
        events.iter().all(|e| e.kind != "reward"),
        "a crash is never scored"
    );

    // The documented exit code (e.g. engine unreachable) is a system failure.
    let tempfail = stack.store.get_rollout("tempfail").await.unwrap();
    assert_eq!(tempfail.status, RolloutStatus::Failed);
    assert_eq!(
        tempfail.reason.as_deref(),
        Some("agent reported a system failure (exit code 75)")
    );
    assert_eq!(tempfail.failure, Some(FailureKind::System));

    let nospawn = stack.store.get_rollout("nospawn").await.unwrap();
    assert_eq!(nospawn.status, RolloutStatus::Failed, "retries are capped");
    assert_eq!(nospawn.failure, Some(FailureKind::System));
    let reason = nospawn.reason.unwrap();
    assert!(
        reason.starts_with("cannot start `/nonexistent/agent`"),
        "{reason}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cancelling_a_running_rollout_kills_its_process_group() {
    let stack = Stack::start(|_| Reply::text("unused"), 0).await;
    let ids = stack.create([("victim".to_string(), json!({}))]).await;
    let pids = stack.dir.path().join("pids");
    let script = format!(
        "sleep 1000 & echo \"$$ $!\" > {p}.tmp; mv {p}.tmp {p}; wait",
        p = pids.display()
    );
    let ctl = stack.spawn_controller(config(&stack, sh(&script)));
    wait_until(Duration::from_secs(20), || pids.exists()).await;
    stack.store.cancel("victim").await.unwrap();
    let text = std::fs::read_to_string(&pids).unwrap();
    let both: Vec<u32> = text
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();
    wait_until(Duration::from_secs(10), || {
        both.iter().all(|&p| !pid_alive(p))
    })
    .await;
    ctl.stop().await;
    for pid in both {
        assert!(!pid_alive(pid), "pid {pid} outlived the cancel");
    }
    assert_eq!(
        stack.store.get_rollout(&ids[0]).await.unwrap().status,
        RolloutStatus::Cancelled
    );
}

/// What an older agl let into a store: JSON no tree parser reads back.
fn unreadable(text: &str) -> agl_wire::rollout::JsonText {
    let raw = serde_json::value::RawValue::from_string(text.into()).expect("raw JSON");
    agl_wire::rollout::JsonText::from_raw(raw)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_stored_rows_do_not_keep_the_controller_from_the_rest() {
    let stack = Stack::start(|_| Reply::text("unused"), 0).await;
    let mut ids = stack
        .create([
            ("ok1".to_string(), json!({})),
            ("ok2".to_string(), json!({})),
        ])
        .await;
    // A queued rollout with an unreadable input, and a running one (left by
    // an earlier controller) with an unreadable execution record.
    let bad = |id: &str, input: &str| agl_store::NewRollout {
        id: Some(id.into()),
        group_id: "g".into(),
        mode: agl_store::Mode::Train,
        input: unreadable(input),
        config: Default::default(),
    };
    stack
        .store
        .create_rollouts(vec![bad("bad", "[1e999]"), bad("stuck", "{}")])
        .await
        .expect("create");
    stack
        .store
        .set_status(
            "stuck",
            &agl_wire::api::StatusPatch::to(1, RolloutStatus::Running),
        )
        .await
        .expect("running");
    stack
        .store
        .append_event(
            "stuck",
            1,
            "execution",
            unreadable(r#"{"runner": "local", "pid": 1e999}"#),
        )
        .await
        .expect("execution");
    ids.extend(["bad".to_string(), "stuck".to_string()]);
    let ctl = stack.spawn_controller(config(&stack, sh("echo fine")));
    stack.wait_terminal(&ids, Duration::from_secs(30)).await;
    ctl.stop().await;
    let recs = stack.records(&ids).await;
    let status: BTreeMap<&str, RolloutStatus> =
        recs.iter().map(|r| (r.id.as_str(), r.status)).collect();
    assert_eq!(status["ok1"], RolloutStatus::Succeeded);
    assert_eq!(status["ok2"], RolloutStatus::Succeeded);
    // Its input reached the agent as the error value, not as a crash.
    assert_eq!(status["bad"], RolloutStatus::Succeeded);
    // Nothing of the old execution could be read: lost, a system failure.
    let stuck = &recs[3];
    assert_eq!(
        (stuck.status, stuck.failure),
        (RolloutStatus::Failed, Some(FailureKind::System))
    );
}

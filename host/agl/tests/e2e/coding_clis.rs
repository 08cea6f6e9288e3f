//! examples/claude-code, examples/codex and examples/opencode end to end:
//! the real `agl run` binary runs each example's own agl.toml (two steps,
//! with the engine, data and output folders pointed at the test's), whose
//! controller starts the real CLI (Claude Code 2.1.328, Codex 0.169.0,
//! OpenCode 1.18.33, from deploy/setup.sh) on two mini-swe tasks. A
//! scripted test engine plays the policy in the Hermes/Qwen-style tools
//! template's ids: on the arith task it runs one `sed` that fixes the bug
//! through the CLI's shell tool, then says it is done; on the bounds task
//! it answers at once. Rewards come from the tasks' tests (1 and 0), each
//! rollout's agent calls are one sample whose trained tokens are exactly
//! the sampled ones, and the update between the steps shows in the weight
//! version every call carries.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Command, Output};

use agl_testengine::{Codec, EngineRequest, Reply, TestEngine, TestEngineConfig};
use serde_json::{Value, json};

use crate::mini_swe::{FIX, IDLE, tasks};
use crate::support::{repo_root, tiny_model};

const AGL: &str = env!("CARGO_BIN_EXE_agl");
const SED: &str = "sed -i 's/return a - b/return a + b/' arith0.py";

/// A harness: its example folder, its shell tool and that tool's
/// arguments for a command, the adapter its agl.toml names.
struct Harness {
    example: &'static str,
    tool: &'static str,
    args: fn(&str) -> Value,
    adapter: &'static str,
}

const CLAUDE_CODE: Harness = Harness {
    example: "claude-code",
    tool: "Bash",
    args: |c| json!({"command": c, "description": "Fix the bug"}),
    adapter: "coding-agent",
};
const CODEX: Harness = Harness {
    example: "codex",
    tool: "exec_command",
    args: |c| json!({"cmd": c}),
    adapter: "coding-agent",
};
const OPENCODE: Harness = Harness {
    example: "opencode",
    tool: "bash",
    args: |c| json!({"command": c, "description": "Fix the bug"}),
    adapter: "trajectory",
};

/// The scripted policy for `h`: the fix, then done; a side call without
/// the shell tool (OpenCode's title) gets a title.
fn policy(h: &'static Harness) -> impl Fn(&EngineRequest) -> Reply + Send + Sync + 'static {
    move |r| {
        let p = &r.prompt_text;
        let offered = p.contains(&format!("\"name\": \"{}\"", h.tool));
        if !offered {
            Reply::text("Fix a bug")
        } else if p.contains("`arith0.py`") && !p.contains("<tool_response>") {
            let call = json!({"name": h.tool, "arguments": (h.args)(SED)});
            Reply::text(format!("<tool_call>\n{call}\n</tool_call>"))
        } else {
            Reply::text("Done.")
        }
    }
}

pub(crate) fn text(out: &Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

pub(crate) fn jsonl(text: &str) -> Vec<Value> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Every agent's stderr, for failure messages.
pub(crate) fn agent_logs(logs: &Path) -> String {
    let mut all = String::new();
    for entry in std::fs::read_dir(logs).into_iter().flatten().flatten() {
        let path = entry.path().join("1/stderr");
        let tail = std::fs::read_to_string(&path).unwrap_or_default();
        let tail: String = tail
            .chars()
            .rev()
            .take(2000)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        all.push_str(&format!("--- {}\n{tail}\n", path.display()));
    }
    all
}

pub(crate) fn agl(dir: &Path, args: &[String]) -> Output {
    Command::new(AGL)
        .args(args)
        .current_dir(dir)
        .env_remove("AGL_CONFIG")
        .env_remove("AGL_ADMIN_KEY")
        .env("MSWE_TASKS_ROOT", dir.join("repos"))
        .output()
        .unwrap()
}

/// `agl rollouts export` of the run in `dir/out` to `dir/rollouts.jsonl`:
/// its rollout JSONL lines.
pub(crate) fn exported(dir: &Path) -> Vec<Value> {
    let db = dir.join("out/agl.db").display().to_string();
    let export = agl(
        dir,
        &["rollouts", "export", "--db", &db, "--out", "rollouts.jsonl"].map(String::from),
    );
    assert!(export.status.success(), "{}", text(&export));
    jsonl(&std::fs::read_to_string(dir.join("rollouts.jsonl")).unwrap())
}

/// `agl plugin test --json` of `dir/rollouts.jsonl` ([`exported`]) with the
/// built-in `adapter` and the `reported` reward: the sample lines.
pub(crate) fn samples_of(dir: &Path, adapter: &str) -> Vec<Value> {
    let plugin = |name: &str| {
        repo_root()
            .join(format!("build/plugins/{name}.wasm"))
            .display()
            .to_string()
    };
    let test = agl(
        dir,
        &[
            "plugin",
            "test",
            "--plugin",
            &plugin(adapter),
            "--reward",
            &plugin("reported"),
            "--rollouts",
            "rollouts.jsonl",
            "--json",
        ]
        .map(String::from),
    );
    assert!(test.status.success(), "{}", text(&test));
    jsonl(&String::from_utf8_lossy(&test.stdout))
}

pub(crate) fn decode(tok: &agl_tokenizer::Tokenizer, ids: &Value) -> String {
    let ids: Vec<u32> = ids
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    tok.decode(&ids, false).unwrap()
}

/// The scripted policy as an engine that reads and writes `tok`'s ids.
pub(crate) async fn policy_engine(
    tok: &std::sync::Arc<agl_tokenizer::Tokenizer>,
    script: impl Fn(&EngineRequest) -> Reply + Send + Sync + 'static,
) -> TestEngine {
    let (e, d) = (tok.clone(), tok.clone());
    let codec = Codec::new(
        move |text| e.encode(text, false).unwrap(),
        move |ids| d.decode(ids, false).unwrap(),
    );
    TestEngine::start(
        TestEngineConfig::default()
            .with_script(script)
            .with_codec(codec),
    )
    .await
    .unwrap()
}

/// `agl --config examples/EXAMPLE/agl.toml -o ... run`: the example's own
/// config with the model, engine, data and output folders pointed at the
/// test's, short controller timings, and `extra` overrides.
pub(crate) fn run_args(
    example: &str,
    dir: &Path,
    engine: &TestEngine,
    extra: &[String],
) -> Vec<String> {
    let config = repo_root().join(format!("examples/{example}/agl.toml"));
    let at = |p: &str| dir.join(p).display().to_string();
    let mut args: Vec<String> = vec!["--config".into(), config.display().to_string()];
    let sets = [
        format!("model.path={:?}", at("model")),
        "engine.kind=\"sglang\"".into(),
        format!("engine.base_url=\"http://{}\"", engine.addr()),
        "engine.model_name=\"tiny\"".into(),
        format!("run.data={:?}", at("data.jsonl")),
        format!("run.out_dir={:?}", at("out")),
        "run.progress=false".into(),
        format!("controller.logs_dir={:?}", at("logs")),
        "controller.timeout_secs=240".into(),
        "controller.kill_grace_secs=1".into(),
        "controller.poll_interval_ms=50".into(),
        "controller.shutdown_wait_secs=2".into(),
        "store.max_system_retries=0".into(),
        "gateway.listen=\"127.0.0.1:0\"".into(),
    ];
    for set in sets.iter().chain(extra) {
        args.push("-o".into());
        args.push(set.clone());
    }
    args.push("run".into());
    args
}

async fn example_trains_two_steps(h: &'static Harness) {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    tiny_model(&dir.join("model"), 32768);
    let (tok, _) = crate::policy::tools_policy(&dir.join("model"));
    tasks(dir);
    // The fixed task and the idle one, a step each.
    let rows: String = std::fs::read_to_string(dir.join("data.jsonl"))
        .unwrap()
        .lines()
        .filter(|l| l.contains(FIX) || l.contains(IDLE))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(dir.join("data.jsonl"), rows).unwrap();
    let engine = policy_engine(&tok, policy(h)).await;
    let args = run_args(
        h.example,
        dir,
        &engine,
        &["train.lr=1e-3".into(), "train.token_budget=65536".into()],
    );
    let run = agl(dir, &args);
    let log = format!("{}\n{}", text(&run), agent_logs(&dir.join("logs")));
    assert!(run.status.success(), "agl run failed:\n{log}");
    let metrics = jsonl(&std::fs::read_to_string(dir.join("out/metrics.jsonl")).unwrap());
    for step in [1, 2] {
        let m = metrics.iter().find(|m| m["step"] == step);
        assert_eq!(
            m.map(|m| &m["rollouts"]),
            Some(&json!(2)),
            "step {step}: {log}"
        );
    }

    let rollouts = exported(dir);
    assert_eq!(rollouts.len(), 4, "{log}");
    let mut versions = BTreeSet::new();
    for r in &rollouts {
        let task = r["input"]["instance_id"].as_str().unwrap();
        let reward = r["events"]
            .as_array()
            .unwrap()
            .iter()
            .rfind(|e| e["kind"] == "reward")
            .unwrap_or_else(|| panic!("{task}: no reward\n{log}"))["payload"]
            .clone();
        let want = if task == FIX { 1.0 } else { 0.0 };
        assert_eq!(
            reward["value"].as_f64(),
            Some(want),
            "{task}: {reward}\n{log}"
        );
        let calls = r["calls"].as_array().unwrap();
        let rollout_versions: BTreeSet<u64> = calls
            .iter()
            .map(|c| c["weight_version"].as_u64().unwrap())
            .collect();
        assert_eq!(rollout_versions.len(), 1, "{task}: one version per rollout");
        versions.extend(rollout_versions);
    }
    // The update after step 1 is version 1 for every call of step 2.
    assert_eq!(versions, BTreeSet::from([0, 1]), "{log}");

    let samples = samples_of(dir, h.adapter);
    for r in &rollouts {
        let id = r["id"].as_str().unwrap();
        // The agent's calls (those offered its shell tool): one chain.
        let tool = format!("\"{}\"", h.tool);
        let agent: Vec<&Value> = r["calls"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["request"].to_string().contains(&tool))
            .collect();
        let fixed = r["input"]["instance_id"] == FIX;
        assert_eq!(agent.len(), if fixed { 2 } else { 1 }, "{id}");
        let sample = samples
            .iter()
            .find(|s| s["rollout_id"] == id && s["sample"]["source_calls"][0] == agent[0]["index"])
            .unwrap_or_else(|| panic!("{id}: no sample for the agent"));
        let sources: Vec<&Value> = agent.iter().map(|c| &c["index"]).collect();
        assert_eq!(
            sample["sample"]["source_calls"]
                .as_array()
                .unwrap()
                .iter()
                .collect::<Vec<_>>(),
            sources,
            "{id}"
        );
        // Trained tokens are exactly what was sampled, in order.
        let response = &sample["sample"]["response_ids"];
        let ids = response.as_array().unwrap();
        let trained: String = sample["sample"]["trainable"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                let (a, b) = (
                    s["start"].as_u64().unwrap() as usize,
                    s["end"].as_u64().unwrap() as usize,
                );
                decode(&tok, &Value::Array(ids[a..b].to_vec()))
            })
            .collect();
        let sampled: String = agent
            .iter()
            .map(|c| decode(&tok, &c["response_ids"]))
            .collect();
        assert_eq!(trained, sampled, "{id}");
        if fixed {
            assert!(
                trained.contains(SED.split('\'').nth(1).unwrap()),
                "{id}: {trained}"
            );
        }
    }

    // `agl eval` with the same config: the base and the run's checkpoint
    // on both tasks. The scripted policy fixes the one task whatever the
    // weights, so each scores 1 of 2 under either.
    let mut args = args;
    args.pop();
    args.extend(
        [
            "eval",
            "--data",
            "data.jsonl",
            "--policy",
            "base",
            "--policy",
            "out",
            "--out",
            "eval",
        ]
        .map(String::from),
    );
    let eval = agl(dir, &args);
    assert!(eval.status.success(), "agl eval failed:\n{}", text(&eval));
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("eval/eval.json")).unwrap())
            .unwrap();
    let policies = report["policies"].as_array().unwrap();
    assert_eq!(policies.len(), 2, "{report}");
    for p in policies {
        let passed: Vec<(&str, u64)> = p["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| (t["task"].as_str().unwrap(), t["passed"].as_u64().unwrap()))
            .collect();
        assert!(
            passed.contains(&(FIX, 1)) && passed.contains(&(IDLE, 0)),
            "{report}"
        );
        assert_eq!(p["pass_at"]["1"], 0.5, "{report}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_claude_code_example_trains_two_steps_on_the_real_cli() {
    example_trains_two_steps(&CLAUDE_CODE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_codex_example_trains_two_steps_on_the_real_cli() {
    example_trains_two_steps(&CODEX).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_opencode_example_trains_two_steps_on_the_real_cli() {
    example_trains_two_steps(&OPENCODE).await;
}

/// A gateway that cannot be reached fails the attempt as a system failure
/// (exit 75: retried, never scored), whether the CLI gives up (Claude
/// Code) or keeps retrying until its time is up (Codex, OpenCode).
#[test]
fn an_unreachable_gateway_is_a_system_failure_for_every_cli() {
    let dir = tempfile::tempdir().unwrap();
    tasks(dir.path());
    let row = std::fs::read_to_string(dir.path().join("data.jsonl")).unwrap();
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    for h in [&CLAUDE_CODE, &CODEX, &OPENCODE] {
        let script = repo_root().join(format!("examples/{}/run_rollout.py", h.example));
        let out = Command::new(crate::support::python())
            .arg(script)
            .env("AGL_INPUT", row.lines().next().unwrap())
            .env("MSWE_TASKS_ROOT", dir.path().join("repos"))
            .env("OPENAI_BASE_URL", format!("http://127.0.0.1:{port}/v1"))
            .env("OPENAI_API_KEY", "t")
            .env("ANTHROPIC_BASE_URL", format!("http://127.0.0.1:{port}"))
            // A reward post would fail loudly (exit 1), not exit 75.
            .env("AGL_EVENT_URL", format!("http://127.0.0.1:{port}/events"))
            .env("CLAUDE_CODE_MAX_RETRIES", "0")
            .env("CX_RETRIES", "0")
            .env("CX_WALL_TIME", "5")
            .env("OC_WALL_TIME", "5")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(75), "{}: {}", h.example, text(&out));
        assert!(text(&out).contains("gateway unreachable"), "{}", text(&out));
    }
}

/// The main agent hands the fix to a sub-agent (Claude Code's Agent tool,
/// its built-in general-purpose agent), which runs the `sed`.
fn delegating(r: &EngineRequest) -> Reply {
    let p = &r.prompt_text;
    let call = |name: &str, arguments: Value| {
        let call = json!({"name": name, "arguments": arguments});
        Reply::text(format!("<tool_call>\n{call}\n</tool_call>"))
    };
    if !p.contains("`arith0.py`") && !p.contains("SUBTASK-7") {
        Reply::text("Nothing to do.")
    } else if p.contains("SUBTASK-7") && !p.contains("DELEGATE-7") {
        // The sub-agent's own conversation.
        if p.contains("<tool_response>") {
            Reply::text("Fixed it.")
        } else {
            call(
                "Bash",
                json!({"command": SED, "description": "Fix the bug"}),
            )
        }
    } else if p.contains("DELEGATE-7") {
        Reply::text("The sub-agent fixed it.")
    } else {
        call(
            "Agent",
            json!({"description": "DELEGATE-7", "subagent_type": "general-purpose",
                   "prompt": "SUBTASK-7: in arith0.py, make add() add."}),
        )
    }
}

/// A Claude Code rollout whose main agent starts a sub-agent: two chains,
/// two samples of the one rollout (the second a `sub-agent` break), both
/// credited with the rollout's reward.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_claude_code_sub_agent_is_a_second_sample_of_the_same_rollout() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    tiny_model(&dir.join("model"), 32768);
    let (tok, _) = crate::policy::tools_policy(&dir.join("model"));
    tasks(dir);
    let row = std::fs::read_to_string(dir.join("data.jsonl"))
        .unwrap()
        .lines()
        .find(|l| l.contains(FIX))
        .map(|l| format!("{l}\n"))
        .unwrap();
    std::fs::write(dir.join("data.jsonl"), row).unwrap();
    let engine = policy_engine(&tok, delegating).await;
    let command = "CC_TOOLS=Bash,Agent CC_BARE=0 CC_MAX_TURNS=6 \
        CC_SYSTEM_PROMPT=\"You fix bugs.\" exec \"${AGL_VENV:-.venv}/bin/python\" \
        examples/claude-code/run_rollout.py";
    let args = run_args(
        "claude-code",
        dir,
        &engine,
        &[
            format!("controller.command={command:?}"),
            "run.steps=1".into(),
            "train.token_budget=131072".into(),
        ],
    );
    let run = agl(dir, &args);
    let log = format!("{}\n{}", text(&run), agent_logs(&dir.join("logs")));
    assert!(run.status.success(), "agl run failed:\n{log}");
    let rollouts = exported(dir);
    let samples = samples_of(dir, "coding-agent");
    for r in &rollouts {
        let id = r["id"].as_str().unwrap();
        let mine: Vec<&Value> = samples.iter().filter(|s| s["rollout_id"] == id).collect();
        assert_eq!(mine.len(), 2, "{id}: main and sub-agent\n{log}");
        for s in &mine {
            assert_eq!(
                s["reward"].as_f64(),
                Some(1.0),
                "{id}: the sub-agent's fix counts"
            );
        }
        assert_eq!(
            mine[1]["sample"]["break_before"]["kind"], "sub-agent",
            "{id}"
        );
        // Every call is in one of the two samples.
        let mut covered: Vec<u64> = mine
            .iter()
            .flat_map(|s| {
                s["sample"]["source_calls"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_u64().unwrap())
            })
            .collect();
        covered.sort();
        let all: Vec<u64> = (0..r["calls"].as_array().unwrap().len() as u64).collect();
        assert_eq!(covered, all, "{id}");
    }
}

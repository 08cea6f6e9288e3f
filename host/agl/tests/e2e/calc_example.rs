//! examples/calc, the main job's harness, end to end on its own agl.toml:
//! the real `agl run` binary, the real Python agent (its `CALC` tool loop
//! over plain HTTP), gateway rendering under SmolLM2's chat template, and a
//! scripted test engine playing the policy (SGLang's token-in API). Two
//! steps: the plumbing the main job's figures rest on, no learning.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use agl::run::report::{StepRecord, panels, read_records};
use agl_testengine::{EngineRequest, Reply};
use serde_json::Value;

use crate::coding_clis::{
    agent_logs, agl, decode, exported, policy_engine, run_args, samples_of, text,
};
use crate::support::{repo_root, tiny_model};

/// SmolLM2-135M-Instruct's chat template (no tools section).
const SMOLLM2_TEMPLATE: &str = "{% for message in messages %}{% if loop.first and \
    messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\nYou are a helpful AI assistant \
    named SmolLM, trained by Hugging Face<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + \
    message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if \
    add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// The policy: per question, every fourth first turn answers without the
/// tool (one call, wrong); the others call `CALC a * b`; after a RESULT
/// (`RESULT a * b = v`),
/// every second answer is off by one. So groups have reward variance and
/// the tool-use rate is neither 0 nor 1.
fn calc_policy(seen: Arc<Mutex<HashMap<String, usize>>>) -> impl Fn(&EngineRequest) -> Reply {
    move |r| {
        let p = &r.prompt_text;
        // The question asked last (the worked example comes first).
        let at = p.rfind("What is ").expect("a question in the prompt");
        let rest = &p[at + "What is ".len()..];
        let question = rest
            .split('?')
            .next()
            .unwrap_or_default()
            .trim()
            .to_string();
        // `RESULT 67 * 25 = 1675`: the value after the `=`.
        let result = rest.find("RESULT ").map(|i| {
            let after = rest[i..]
                .split("= ")
                .nth(1)
                .expect("RESULT <expr> = <value>");
            let digits: String = after.chars().take_while(|c| c.is_ascii_digit()).collect();
            digits.parse::<i64>().expect("a RESULT value")
        });
        let n = {
            let mut seen = seen.lock().unwrap();
            let n = seen
                .entry(format!("{question}|{}", result.is_some()))
                .or_insert(0);
            *n += 1;
            *n
        };
        match result {
            Some(value) => {
                let answer = if n % 2 == 0 { value + 1 } else { value };
                Reply::text(format!("{question} = {answer}"))
            }
            None if n % 4 == 0 => Reply::text("About 100."),
            None => Reply::text(format!("CALC {question}")),
        }
    }
}

/// Train rows then val rows of the example's data.
fn data(dir: &Path, train: usize, val: usize) {
    let rows = std::fs::read_to_string(repo_root().join("examples/calc/data.jsonl")).unwrap();
    let rows: Vec<&str> = rows.lines().collect();
    let of = |split: &str, n: usize| -> Vec<String> {
        let tag = format!("\"split\": \"{split}\"");
        rows.iter()
            .filter(|l| l.contains(&tag))
            .take(n)
            .map(|l| format!("{l}\n"))
            .collect()
    };
    let text: String = [of("train", train), of("val", val)].concat().concat();
    std::fs::write(dir.join("data.jsonl"), text).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_calc_example_runs_its_tool_loop_as_one_sample_per_rollout() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    tiny_model(&dir.join("model"), 4096);
    let (tok, _) = crate::policy::tools_policy(&dir.join("model"));
    std::fs::write(dir.join("model/chat_template.jinja"), SMOLLM2_TEMPLATE).unwrap();
    data(dir, 8, 4);
    let engine = policy_engine(&tok, calc_policy(Arc::default())).await;
    let sets = [
        "run.steps=2",
        "run.group_size=4",
        "run.groups_per_step=2",
        "run.val_every=2",
        "run.val_size=4",
        "controller.concurrency=8",
        "train.lr=1e-3",
    ];
    let args = run_args("calc", dir, &engine, &sets.map(String::from));
    let run = agl(dir, &args);
    let log = format!("{}\n{}", text(&run), agent_logs(&dir.join("logs")));
    assert!(run.status.success(), "agl run failed:\n{log}");

    // The terminal: a header, the baseline line, two lines per step, the
    // plot's path, the summary table, the closing line; no INFO log (that
    // is in the run folder's agl.log).
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        !stderr.contains("INFO"),
        "INFO logs on the terminal:\n{stderr}"
    );
    let agl_log = std::fs::read_to_string(dir.join("out/agl.log")).unwrap();
    assert!(agl_log.contains("gateway listening"), "{agl_log}");
    let before_summary: Vec<&str> = stdout
        .lines()
        .take_while(|l| !l.starts_with("plot:"))
        .collect();
    assert_eq!(before_summary.len(), 1 + 1 + 2 * 2, "{stdout}");
    assert!(
        before_summary[0].starts_with("agl run: gateway http://"),
        "{stdout}"
    );
    assert!(
        before_summary[1].starts_with("baseline v0 | val"),
        "{stdout}"
    );
    assert!(
        before_summary[2].starts_with("step 1/2 v1 | reward"),
        "{stdout}"
    );
    assert!(
        stdout.contains("run summary") && stdout.contains("tool use"),
        "{stdout}"
    );

    let rollouts = exported(dir);
    assert_eq!(
        rollouts.len(),
        2 * 8 + 2 * 4,
        "2 steps of 8, 2 validations of 4\n{log}"
    );
    let samples = samples_of(dir, "trajectory");

    // Per step: (rollouts, model calls, rollouts that used the tool).
    let mut by_step: HashMap<u64, (usize, usize, usize)> = HashMap::new();
    for r in &rollouts {
        let id = r["id"].as_str().unwrap();
        let calls = r["calls"].as_array().unwrap();
        let events = r["events"].as_array().unwrap();
        let tools = events.iter().filter(|e| e["kind"] == "tool_call").count();
        assert!(
            matches!((calls.len(), tools), (1, 0) | (2, 1)),
            "{id}: {} calls, {tools} tool calls",
            calls.len()
        );
        let reward = events.iter().rfind(|e| e["kind"] == "reward").unwrap();
        assert_eq!(reward["payload"]["calls"], calls.len(), "{id}");
        if id.starts_with('g') {
            let version = calls[0]["weight_version"].as_u64().unwrap();
            let step = by_step.entry(version + 1).or_default();
            step.0 += 1;
            step.1 += calls.len();
            step.2 += usize::from(tools > 0);
        }

        // One sample per rollout, no break; trained = exactly what was
        // sampled; masked = the turn's closing and the RESULT turn.
        let mine: Vec<&Value> = samples.iter().filter(|s| s["rollout_id"] == id).collect();
        assert_eq!(mine.len(), 1, "{id}: one sample");
        let sample = &mine[0]["sample"];
        assert!(sample["break_before"].is_null(), "{id}: {sample}");
        let ids = sample["response_ids"].as_array().unwrap();
        let spans = crate::conversation::spans(sample);
        let piece = |a: usize, b: usize| decode(&tok, &Value::Array(ids[a..b].to_vec()));
        let trained: String = spans.iter().map(|&(a, b)| piece(a, b)).collect();
        let sampled: String = calls
            .iter()
            .map(|c| decode(&tok, &c["response_ids"]))
            .collect();
        assert_eq!(trained, sampled, "{id}");
        assert!(
            !trained.contains("RESULT"),
            "{id}: a tool result trained: {trained}"
        );
        if tools > 0 {
            let masked = piece(spans[0].1, spans[1].0);
            let value =
                events.iter().find(|e| e["kind"] == "tool_call").unwrap()["payload"]["output"]
                    .as_str()
                    .unwrap()
                    .to_string();
            assert!(
                masked.contains("RESULT ") && masked.contains(&format!("= {value}")),
                "{id}: the masked context is the tool result: {masked:?}"
            );
            // The second call continued the first token-exactly.
            assert_eq!(calls[1]["continues"], calls[0]["index"], "{id}");
        }
    }

    // The step records count what the rollouts did.
    let records = read_records(&dir.join("out/metrics.jsonl")).unwrap();
    for step in [1u64, 2] {
        let rec: &StepRecord = records.iter().find(|r| r.step == step).unwrap();
        let (n, calls, tools) = by_step[&step];
        assert_eq!(rec.rollouts, n, "step {step}");
        assert_eq!(rec.samples, n, "step {step}: one sample per rollout");
        assert_eq!(rec.breaks.values().sum::<usize>(), 0, "step {step}");
        assert_eq!(
            rec.calls_per_rollout,
            Some(calls as f64 / n as f64),
            "step {step}"
        );
        assert_eq!(rec.tool_use, Some(tools as f64 / n as f64), "step {step}");
        assert!(
            tools > 0 && tools < n,
            "step {step}: {tools} of {n} used the tool"
        );
    }
    let last = records.iter().find(|r| r.step == 2).unwrap();
    assert_eq!(last.val_rollouts, 4);
    assert!(last.val_tool_use.is_some() && last.val_calls_per_rollout.is_some());

    // The plot: the panels this run's records fill are there (what a panel
    // draws from its records is run_report.rs's to check).
    let drawn = panels(&records);
    let titles: Vec<&str> = drawn.iter().map(|p| p.title).collect();
    for want in [
        "reward",
        "tool use",
        "per rollout",
        "gradient norm",
        "trainer vs engine",
    ] {
        assert!(
            titles.iter().any(|t| t.starts_with(want)),
            "{want} missing: {titles:?}"
        );
    }
    assert!(dir.join("out/training.png").exists());
}

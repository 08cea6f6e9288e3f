//! `agl run` with `[train] world_size = 2`: the run starts a second trainer
//! rank (`agl trainer-rank`) that joins over libtorch's c10d Gloo; two sync
//! steps train on both ranks, rank 0 publishes, and both end with the same
//! weights (debug builds compare the hash after every update; both ranks
//! log it). A rank killed mid-run stops the run with an error that names
//! it, and what the store recorded stays readable and resumable.

use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

use agl_store::Store;

use crate::agl_run::{Setup, finish};

fn data_parallel(setup: &Setup, out: &str, run: &str, train: &str) -> std::path::PathBuf {
    let config = setup.config(out, run);
    let text = std::fs::read_to_string(&config).unwrap();
    let text = text.replace(
        "token_budget = 4096",
        &format!("token_budget = 4096\nworld_size = 2\n{train}"),
    );
    std::fs::write(&config, text).unwrap();
    config
}

/// The `weights_hash` values of log lines containing `marker`.
fn hashes(log: &str, marker: &str) -> Vec<String> {
    log.lines()
        .filter(|l| l.contains(marker))
        .filter_map(|l| l.split("weights_hash=").nth(1))
        .map(|h| {
            h.trim_matches('"')
                .split_whitespace()
                .next()
                .unwrap_or("")
                .trim_matches('"')
                .to_string()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_ranks_train_two_steps_and_end_with_the_same_weights() {
    let setup = Setup::new().await;
    let config = data_parallel(&setup, "dp", "steps = 2\nmode = \"sync\"", "zero1 = true");
    let log = finish(setup.spawn(&config, false));
    let out = setup.out("dp");
    let file = std::fs::read_to_string(out.join("agl.log")).unwrap();
    assert!(
        file.contains("data-parallel trainer ranks joined"),
        "{file}"
    );
    // Rank 0 logs each update's agreed hash; rank 1 its own when it stops.
    let rank0 = hashes(&file, "data-parallel ranks hold the same weights");
    assert_eq!(rank0.len(), 2, "one per update:\n{file}");
    let rank1 = hashes(&log, "trainer rank stopped");
    assert_eq!(rank1.len(), 1, "rank 1 stops once:\n{log}");
    assert_eq!(rank0.last(), rank1.last(), "{file}\n{log}");
    assert_ne!(rank0[0], rank0[1], "the second update moved the weights");
    let steps: Vec<u64> = std::fs::read_to_string(out.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["step"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(steps, [0, 1, 2], "{log}");
    // A ZeRO-1 checkpoint holds the whole optimizer state.
    let state = out.join("checkpoints/step-000002/optimizer.safetensors");
    let tensors = tch::Tensor::read_safetensors(&state).unwrap();
    let moments = tensors
        .iter()
        .filter(|(n, _)| n.starts_with("exp_avg."))
        .count();
    let model = std::fs::read_dir(out.join("checkpoints/step-000002/model"))
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.path().extension().is_some_and(|x| x == "safetensors"))
        .map(|e| tch::Tensor::read_safetensors(e.path()).unwrap().len())
        .sum::<usize>();
    assert_eq!(moments, model, "every parameter's moments, from both ranks");
}

/// The `agl trainer-rank` child of `parent`, once it runs.
fn rank_child(parent: u32) -> Option<u32> {
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // pid (comm) state ppid ...
        let ppid = stat
            .rsplit(')')
            .next()
            .and_then(|rest| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        let cmdline = std::fs::read_to_string(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if ppid == Some(parent) && cmdline.contains("trainer-rank") {
            return Some(pid);
        }
    }
    None
}

fn wait_for(path: &Path, what: &str, child: &mut Child) {
    let deadline = Instant::now() + Duration::from_secs(240);
    while !path.exists() {
        assert!(
            child.try_wait().unwrap().is_none(),
            "agl run ended before {what}"
        );
        assert!(Instant::now() < deadline, "no {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_rank_stops_the_run_with_its_name_and_loses_nothing() {
    let setup = Setup::new().await;
    let config = data_parallel(&setup, "dpkill", "steps = 4\nmode = \"sync\"", "");
    let mut child = setup.spawn(&config, false);
    let out = setup.out("dpkill");
    wait_for(
        &out.join("checkpoints/step-000001/meta.json"),
        "first checkpoint",
        &mut child,
    );
    let rank = rank_child(child.id()).expect("agl run started rank 1");
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &rank.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let output = child.wait_with_output().unwrap();
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(!output.status.success(), "the run must stop:\n{text}");
    assert!(
        text.contains("rank 1 exited"),
        "the error names the rank:\n{text}"
    );
    // Everything recorded is still there and readable.
    let store = Store::open(out.join("agl.db")).unwrap();
    let page = store
        .list_rollouts(agl_store::RolloutFilter::default(), None, 500)
        .await
        .unwrap();
    assert!(page.rollouts.len() >= 4, "step 1's rollouts at least");
    for r in &page.rollouts {
        store.export_rollout(&r.id).await.unwrap();
    }
    // And the run resumes from its checkpoint with both ranks again.
    let log = finish(setup.spawn(&config, true));
    assert!(log.contains("run finished after 4 steps"), "{log}");
}

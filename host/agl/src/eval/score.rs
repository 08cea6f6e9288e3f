//! What `agl eval` measures: per task, how many of its samples passed;
//! per policy, pass@k by the unbiased estimator, and the tables and JSON
//! that show them.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

/// Unbiased pass@k of a task with `n` samples of which `c` passed (Chen et
/// al. 2021, "Evaluating Large Language Models Trained on Code"):
/// `1 - C(n-c, k) / C(n, k)`, as a product so large `n` cannot overflow.
/// `None` when `k` is 0 or more than the samples.
pub fn pass_at_k(n: usize, c: usize, k: usize) -> Option<f64> {
    if k == 0 || k > n || c > n {
        return None;
    }
    if n - c < k {
        return Some(1.0);
    }
    let fail_all: f64 = (n - c + 1..=n).map(|i| 1.0 - k as f64 / i as f64).product();
    Some(1.0 - fail_all)
}

/// The k values reported for `samples` per task: 1, 2, 4, ... and
/// `samples` itself.
pub fn reported_ks(samples: usize) -> Vec<usize> {
    let mut ks: Vec<usize> = std::iter::successors(Some(1usize), |k| k.checked_mul(2))
        .take_while(|k| *k <= samples)
        .collect();
    if samples > 0 && ks.last() != Some(&samples) {
        ks.push(samples);
    }
    ks
}

/// One task (data row) under one policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskResult {
    /// The row's `instance_id`, `id` or `task_id`, else `#<row index>`.
    pub task: String,
    /// Scored samples (each its own rollout).
    pub samples: usize,
    /// Samples whose reward reached the pass threshold.
    pub passed: usize,
    /// Rollouts without a score: system failures (after the store's
    /// retries), no reward, a failed reward plugin.
    pub excluded: usize,
    /// The mean reward of the scored samples.
    pub mean_reward: Option<f64>,
    /// The rollouts, for `agl rollouts show` and the viewer.
    pub rollouts: Vec<String>,
}

/// One policy over every task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicyResult {
    /// `base`, or the checkpoint folder.
    pub policy: String,
    /// The weight version the engine served it under.
    pub weight_version: u64,
    /// pass@k for each reported k (JSON keys "1", "2", ...), the mean over
    /// the tasks with at least k scored samples.
    pub pass_at: BTreeMap<usize, f64>,
    /// The mean reward over every scored sample.
    pub mean_reward: Option<f64>,
    pub scored: usize,
    pub excluded: usize,
    pub tasks: Vec<TaskResult>,
}

impl PolicyResult {
    pub fn new(policy: String, weight_version: u64, k: usize, tasks: Vec<TaskResult>) -> Self {
        let mut pass_at = BTreeMap::new();
        for kk in reported_ks(k) {
            let per_task: Vec<f64> = tasks
                .iter()
                .filter_map(|t| pass_at_k(t.samples, t.passed, kk))
                .collect();
            if !per_task.is_empty() {
                pass_at.insert(kk, per_task.iter().sum::<f64>() / per_task.len() as f64);
            }
        }
        let scored: usize = tasks.iter().map(|t| t.samples).sum();
        let reward_sum: f64 = tasks
            .iter()
            .filter_map(|t| t.mean_reward.map(|r| r * t.samples as f64))
            .sum();
        PolicyResult {
            policy,
            weight_version,
            pass_at,
            mean_reward: (scored > 0).then(|| reward_sum / scored as f64),
            scored,
            excluded: tasks.iter().map(|t| t.excluded).sum(),
            tasks,
        }
    }
}

/// What `agl eval` writes (`eval.json`, `--json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalReport {
    /// The data file the tasks came from.
    pub data: String,
    /// Which of its rows: `val`, `train` or `all`.
    pub split: String,
    /// Samples per task.
    pub k: usize,
    /// A sample passes when its reward is at least this.
    pub pass_threshold: f64,
    /// The gateway's sampling temperature for them.
    pub temperature: Option<f64>,
    /// One entry per policy, in the order asked.
    pub policies: Vec<PolicyResult>,
}

fn cell(x: Option<f64>) -> String {
    x.map_or_else(|| "-".into(), |v| format!("{v:.3}"))
}

impl EvalReport {
    /// The summary (pass@k, mean reward, scored) with one column per
    /// policy, then the per-task table (passed/samples per policy).
    pub fn table(&self) -> String {
        let heads: Vec<String> = self.policies.iter().map(|p| short(&p.policy)).collect();
        let width = heads.iter().map(|h| h.len()).max().unwrap_or(0).max(9);
        let mut rows: Vec<(String, Vec<String>)> = Vec::new();
        for k in reported_ks(self.k) {
            let cells = self
                .policies
                .iter()
                .map(|p| cell(p.pass_at.get(&k).copied()))
                .collect();
            rows.push((format!("pass@{k}"), cells));
        }
        rows.push((
            "mean reward".into(),
            self.policies.iter().map(|p| cell(p.mean_reward)).collect(),
        ));
        rows.push((
            "scored".into(),
            self.policies
                .iter()
                .map(|p| format!("{}/{}", p.scored, p.scored + p.excluded))
                .collect(),
        ));
        let mut tasks: Vec<String> = Vec::new();
        for p in &self.policies {
            for t in &p.tasks {
                if !tasks.contains(&t.task) {
                    tasks.push(t.task.clone());
                }
            }
        }
        let task_rows: Vec<(String, Vec<String>)> = tasks
            .iter()
            .map(|task| {
                let cells = self
                    .policies
                    .iter()
                    .map(|p| match p.tasks.iter().find(|t| &t.task == task) {
                        Some(t) if t.excluded > 0 => {
                            format!("{}/{} ({} excl)", t.passed, t.samples, t.excluded)
                        }
                        Some(t) => format!("{}/{}", t.passed, t.samples),
                        None => "-".into(),
                    })
                    .collect();
                (task.clone(), cells)
            })
            .collect();
        let label = rows
            .iter()
            .chain(&task_rows)
            .map(|(l, _)| l.len())
            .max()
            .unwrap_or(0)
            .max(4);
        let width = task_rows
            .iter()
            .flat_map(|(_, c)| c.iter().map(String::len))
            .max()
            .unwrap_or(0)
            .max(width);
        let mut out = String::new();
        let line = |out: &mut String, l: &str, cells: &[String]| {
            let _ = write!(out, "{l:<label$}");
            for c in cells {
                let _ = write!(out, "  {c:>width$}");
            }
            out.push('\n');
        };
        line(&mut out, "", &heads);
        for (l, c) in &rows {
            line(&mut out, l, c);
        }
        out.push('\n');
        line(&mut out, "task", &heads);
        for (l, c) in &task_rows {
            line(&mut out, l, c);
        }
        out
    }
}

/// A column head: `base`, or a checkpoint as `<run>/<step-N>`.
fn short(policy: &str) -> String {
    let parts: Vec<&str> = policy.trim_end_matches('/').rsplit('/').take(3).collect();
    match parts.as_slice() {
        [step, "checkpoints", run] => format!("{run}/{step}"),
        [last, ..] => (*last).to_owned(),
        [] => policy.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pass_at_k_is_the_unbiased_estimator() {
        // n = 4, c = 1: pass@1 = 1/4; pass@2 = 1 - C(3,2)/C(4,2) = 1 - 3/6.
        assert_eq!(pass_at_k(4, 1, 1), Some(0.25));
        assert!((pass_at_k(4, 1, 2).unwrap() - 0.5).abs() < 1e-12);
        assert_eq!(pass_at_k(4, 1, 4), Some(1.0));
        // n = 5, c = 2, k = 2: 1 - C(3,2)/C(5,2) = 1 - 3/10.
        assert!((pass_at_k(5, 2, 2).unwrap() - 0.7).abs() < 1e-12);
        // n = 10, c = 3, k = 5: 1 - C(7,5)/C(10,5) = 1 - 21/252.
        assert!((pass_at_k(10, 3, 5).unwrap() - (1.0 - 21.0 / 252.0)).abs() < 1e-12);
        assert_eq!(pass_at_k(3, 0, 2), Some(0.0));
        assert_eq!(pass_at_k(3, 3, 3), Some(1.0));
        assert_eq!(pass_at_k(2, 1, 3), None);
        assert_eq!(pass_at_k(2, 1, 0), None);
        // Large n neither overflows nor loses the value.
        let big = pass_at_k(1000, 10, 100).unwrap();
        assert!(big > 0.65 && big < 0.66, "{big}");
    }

    #[test]
    fn reported_ks_are_powers_of_two_and_the_samples() {
        assert_eq!(reported_ks(1), vec![1]);
        assert_eq!(reported_ks(4), vec![1, 2, 4]);
        assert_eq!(reported_ks(6), vec![1, 2, 4, 6]);
        assert!(reported_ks(0).is_empty());
    }

    fn task(name: &str, samples: usize, passed: usize, excluded: usize) -> TaskResult {
        TaskResult {
            task: name.into(),
            samples,
            passed,
            excluded,
            mean_reward: (samples > 0).then(|| passed as f64 / samples as f64),
            rollouts: vec![],
        }
    }

    #[test]
    fn a_policy_averages_over_the_tasks_that_have_k_samples() {
        // Task b lost two samples to system failures: it counts for pass@1
        // and pass@2, not for pass@4.
        let p = PolicyResult::new(
            "base".into(),
            0,
            4,
            vec![task("a", 4, 1, 0), task("b", 2, 2, 2), task("c", 4, 0, 0)],
        );
        assert!((p.pass_at[&1] - (0.25 + 1.0 + 0.0) / 3.0).abs() < 1e-12);
        assert!((p.pass_at[&2] - (0.5 + 1.0 + 0.0) / 3.0).abs() < 1e-12);
        assert!((p.pass_at[&4] - (1.0 + 0.0) / 2.0).abs() < 1e-12);
        assert_eq!((p.scored, p.excluded), (10, 2));
        assert!((p.mean_reward.unwrap() - 3.0 / 10.0).abs() < 1e-12);
        let json = serde_json::to_value(&p).unwrap();
        assert_eq!(json["pass_at"]["4"], 0.5);
    }

    #[test]
    fn the_table_puts_policies_side_by_side() {
        let report = EvalReport {
            data: "d.jsonl".into(),
            split: "val".into(),
            k: 2,
            pass_threshold: 1.0,
            temperature: Some(1.0),
            policies: vec![
                PolicyResult::new("base".into(), 0, 2, vec![task("t1", 2, 0, 0)]),
                PolicyResult::new(
                    "/runs/main/checkpoints/step-000006".into(),
                    1,
                    2,
                    vec![task("t1", 2, 2, 0)],
                ),
            ],
        };
        let table = report.table();
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[0].contains("base") && lines[0].contains("main/step-000006"));
        assert!(lines[1].starts_with("pass@1") && lines[1].ends_with("1.000"));
        assert!(lines[1].contains("0.000"));
        let t1 = lines.iter().find(|l| l.starts_with("t1")).unwrap();
        assert!(t1.contains("0/2") && t1.ends_with("2/2"), "{table}");
    }
}

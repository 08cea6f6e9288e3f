//! A finished rollout, from the store through the plugins, to what the
//! trainer takes: samples from the adapter plugin, a reward from the reward
//! plugin, and how the rollout ended (system failures are never scored).

use std::collections::BTreeMap;

use agl_trainer::rl::{self, Outcome};

use crate::link::Link;
use crate::plugins::{Plugins, describe, score};
use agl_wire::api::{LoadedPlugin, PluginRole};
use agl_wire::record::TOOL_CALL;
use agl_wire::rollout::{FailureKind, Rollout, RolloutStatus, Sample};

/// One finished rollout as the trainer sees it, plus what the report counts.
pub struct Collected {
    pub rollout: rl::ScoredRollout,
    /// Chain breaks by class (`retokenize`, `template`, `other`).
    pub breaks: BTreeMap<String, usize>,
    /// The adapter or reward plugin failed: the rollout is excluded.
    pub plugin_failed: bool,
    /// The plugins that built and scored it.
    pub plugins: Vec<LoadedPlugin>,
    /// What the harness did (empty for a system failure).
    pub turns: Turns,
}

/// One rollout's model calls and the tools its harness reported running.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Turns {
    /// Model requests (the choices of an `n` > 1 request count once).
    pub calls: usize,
    /// `tool_call` events of the attempt.
    pub tool_calls: usize,
}

impl Turns {
    pub fn of(rollout: &Rollout) -> Turns {
        Turns {
            calls: rollout
                .calls
                .iter()
                .filter(|c| c.choice.is_none_or(|ch| ch.index == 0))
                .count(),
            tool_calls: rollout
                .events
                .iter()
                .filter(|e| e.kind == TOOL_CALL)
                .count(),
        }
    }
}

/// Calls per rollout and the share of rollouts that used a tool, over the
/// scored rollouts of a step (or of a validation).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TurnTally {
    rollouts: usize,
    calls: usize,
    tool_rollouts: usize,
}

impl TurnTally {
    pub fn add(&mut self, t: Turns) {
        self.rollouts += 1;
        self.calls += t.calls;
        self.tool_rollouts += usize::from(t.tool_calls > 0);
    }

    pub fn calls_per_rollout(&self) -> Option<f64> {
        (self.rollouts > 0).then(|| self.calls as f64 / self.rollouts as f64)
    }

    pub fn tool_use(&self) -> Option<f64> {
        (self.rollouts > 0).then(|| self.tool_rollouts as f64 / self.rollouts as f64)
    }
}

/// How the controller says the rollout ended (`status`, and whose failure).
pub fn outcome(status: RolloutStatus, failure: Option<FailureKind>) -> Outcome {
    match status {
        RolloutStatus::Succeeded => Outcome::Succeeded,
        RolloutStatus::Failed if failure == Some(FailureKind::Agent) => Outcome::AgentFailure,
        // Cancelled, system-failed (or, defensively, not terminal).
        _ => Outcome::SystemFailure,
    }
}

/// Reads rollout `id` (one export: how it ended, its calls and events) and
/// runs the plugins over it. Plugin errors exclude the rollout (logged),
/// they never stop the run.
pub async fn collect(link: &Link, plugins: &Plugins, id: &str) -> anyhow::Result<Collected> {
    let exported = link.export(id).await?;
    let mut out = Collected {
        rollout: rl::ScoredRollout {
            id: exported.id.clone(),
            group_id: exported.group_id.clone(),
            reward: None,
            outcome: outcome(exported.status, exported.failure),
            samples: Vec::new(),
        },
        breaks: BTreeMap::new(),
        plugin_failed: false,
        plugins: Vec::new(),
        turns: Turns::default(),
    };
    if out.rollout.outcome == Outcome::SystemFailure {
        return Ok(out);
    }
    out.turns = Turns::of(&exported);
    // One snapshot for the whole rollout: a swap landing meanwhile applies
    // from the next rollout on.
    let (adapter, reward) = (plugins.adapter(), plugins.reward());
    out.plugins.push(describe(PluginRole::Adapter, &adapter));
    out.plugins
        .extend(reward.as_ref().map(|r| describe(PluginRole::Reward, r)));
    match adapter.build_samples(&exported).await {
        Ok(samples) => {
            for s in &samples {
                if let Some(b) = &s.break_before {
                    *out.breaks.entry(b.kind.as_str().to_string()).or_default() += 1;
                }
            }
            out.rollout.samples = samples.into_iter().map(to_trainer).collect();
        }
        Err(e) => {
            tracing::warn!(rollout = id, error = %e, "sample adapter failed; rollout excluded");
            out.plugin_failed = true;
        }
    }
    match score(reward.as_ref(), &exported).await {
        Ok(r) => out.rollout.reward = r,
        Err(e) => {
            tracing::warn!(rollout = id, error = %e, "reward plugin failed; rollout excluded");
            out.plugin_failed = true;
        }
    }
    if out.plugin_failed {
        // Excluded like a system failure: not the policy's doing.
        out.rollout.outcome = Outcome::SystemFailure;
        out.rollout.samples.clear();
    }
    Ok(out)
}

fn to_trainer(s: Sample) -> rl::Sample {
    let spans: Vec<std::ops::Range<usize>> = s
        .trainable
        .iter()
        .map(|sp| sp.start as usize..sp.end as usize)
        .collect();
    rl::Sample {
        mask: rl::Sample::mask_from_spans(s.response_ids.len(), &spans),
        prompt_ids: s.prompt_ids.iter().map(|&t| i64::from(t)).collect(),
        response_ids: s.response_ids.iter().map(|&t| i64::from(t)).collect(),
        engine_logprobs: s.logprobs,
        weight_version: s.weight_version,
        ref_logprobs: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rollout(choices: &[Option<(u32, u32)>], events: &[&str]) -> Rollout {
        let calls: Vec<serde_json::Value> = choices
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let mut call = serde_json::json!({
                    "index": i, "api": "chat_completions", "request": {}, "response": {},
                    "prompt_ids": [1], "response_ids": [2], "response_logprobs": [-0.5],
                });
                if let Some((index, count)) = c {
                    call["choice"] = serde_json::json!({"index": index, "count": count});
                }
                call
            })
            .collect();
        let events: Vec<serde_json::Value> = events
            .iter()
            .map(|k| serde_json::json!({"kind": k, "payload": {"name": "calculator"}}))
            .collect();
        serde_json::from_value(serde_json::json!({
            "id": "r", "status": "succeeded", "calls": calls, "events": events,
        }))
        .unwrap()
    }

    #[test]
    fn turns_count_requests_and_the_harness_tool_calls() {
        // A request with 3 choices counts once; the next call is its own.
        let r = rollout(
            &[Some((0, 3)), Some((1, 3)), Some((2, 3)), None],
            &["tool_call", "reward", "tool_call"],
        );
        assert_eq!(
            Turns::of(&r),
            Turns {
                calls: 2,
                tool_calls: 2
            }
        );
        let mut tally = TurnTally::default();
        assert_eq!((tally.calls_per_rollout(), tally.tool_use()), (None, None));
        tally.add(Turns::of(&r));
        tally.add(Turns::of(&rollout(&[None], &["reward"])));
        assert_eq!(tally.calls_per_rollout(), Some(1.5));
        assert_eq!(
            tally.tool_use(),
            Some(0.5),
            "one of two rollouts used a tool"
        );
    }

    #[test]
    fn system_failures_and_cancellations_are_not_scored() {
        use RolloutStatus::*;
        assert_eq!(outcome(Succeeded, None), Outcome::Succeeded);
        assert_eq!(
            outcome(Failed, Some(FailureKind::Agent)),
            Outcome::AgentFailure
        );
        assert_eq!(
            outcome(Failed, Some(FailureKind::System)),
            Outcome::SystemFailure
        );
        assert_eq!(outcome(Cancelled, None), Outcome::SystemFailure);
    }
}

//! A finished rollout, from the store through the plugins, to what the
//! trainer takes: samples from the adapter plugin, a reward from the reward
//! plugin, and how the rollout ended (system failures are never scored).

use std::collections::BTreeMap;
use std::sync::Arc;

use agl_rl::{self as rl, Outcome};

use crate::link::Link;
use crate::plugins::{Plugins, describe, score};
use agl_plugin_host::Plugin;
use agl_wire::api::{LoadedPlugin, PluginRole};
use agl_wire::record::TOOL_CALL;
use agl_wire::rollout::{FailureKind, ModelCall, Rollout, RolloutStatus, Sample};

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
    /// The temperatures the gateway recorded sampling its calls at (each
    /// once; empty for records from before they were recorded).
    pub temperatures: Vec<f64>,
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

/// Rollout `id` read back and scored as validation and evaluation score it
/// (no samples): its reward and export, or `None` for a system failure, a
/// rollout without a reward, or one whose reward plugin failed (logged).
pub async fn scored(
    link: &dyn Link,
    reward: Option<&Plugin>,
    id: &str,
) -> anyhow::Result<Option<(f64, Arc<Rollout>)>> {
    let exported = Arc::new(link.export(id).await?);
    if outcome(exported.status, exported.failure) == Outcome::SystemFailure {
        return Ok(None);
    }
    match score(reward, &exported).await {
        Ok(r) => Ok(r.map(|r| (r, exported))),
        Err(e) => {
            tracing::warn!(rollout = %id, error = %e, "reward failed: not scored");
            Ok(None)
        }
    }
}

/// Reads rollout `id` (one export: how it ended, its calls and events) and
/// runs the plugins over it. Plugin errors exclude the rollout (logged),
/// they never stop the run.
pub async fn collect(link: &dyn Link, plugins: &Plugins, id: &str) -> anyhow::Result<Collected> {
    // Shared with the plugins, which read its bulky parts on demand.
    let exported = Arc::new(link.export(id).await?);
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
        temperatures: Vec::new(),
    };
    if out.rollout.outcome == Outcome::SystemFailure {
        return Ok(out);
    }
    out.turns = Turns::of(&exported);
    for t in exported.calls.iter().filter_map(|c| c.temperature) {
        if !out.temperatures.contains(&t) {
            out.temperatures.push(t);
        }
    }
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
            out.rollout.samples = samples
                .into_iter()
                .map(|s| {
                    let versions = token_versions(&s, &exported.calls);
                    to_trainer(s, versions)
                })
                .collect();
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

/// The weight version that sampled each response token of `sample`, from
/// its source calls: its trained tokens are those calls' sampled tokens, in
/// order (what the SDKs' merge builds), so the k-th trained token has the
/// k-th sampled token's version; masked positions get the sample's version.
/// `None` when every token is of the sample's version (nothing to tell
/// apart), or when the spans do not line up with the calls' tokens (a
/// plugin that trains otherwise): the sample's version then stands for all.
pub fn token_versions(sample: &Sample, calls: &[ModelCall]) -> Option<Vec<u64>> {
    let sources: Vec<&ModelCall> = sample
        .source_calls
        .iter()
        .filter_map(|&i| calls.iter().find(|c| c.index == i))
        .collect();
    let sampled: Vec<u64> = sources.iter().flat_map(|c| c.token_versions()).collect();
    if sampled.iter().all(|&v| v == sample.weight_version)
        || sampled.len() != sample.trainable_tokens()
    {
        return None;
    }
    let mut versions = vec![sample.weight_version; sample.response_ids.len()];
    let trained = sample
        .trainable
        .iter()
        .flat_map(|s| s.start as usize..s.end as usize);
    for (at, v) in trained.zip(sampled) {
        if let Some(slot) = versions.get_mut(at) {
            *slot = v;
        }
    }
    Some(versions)
}

/// The temperature the trainer scores at: the one the gateway recorded
/// sampling at (`sampled`, adopted from the first rollout that has one), not
/// this process's copy of `[gateway] train_temperature` (`configured`,
/// used only while no record says). A rollout sampled at another
/// temperature than the adopted one is an error: one update cannot score
/// its tokens at two.
pub fn adopt_temperatures(
    sampled: &mut Option<f64>,
    configured: f64,
    recorded: &[f64],
) -> anyhow::Result<()> {
    for &t in recorded {
        match *sampled {
            None => {
                if t != configured {
                    tracing::warn!(
                        sampled = t,
                        configured,
                        "the gateway samples at another temperature than this \
                         config's gateway.train_temperature: training at the sampled one"
                    );
                }
                *sampled = Some(t);
            }
            Some(s) if s != t => anyhow::bail!(
                "rollouts sampled at two temperatures ({s} and {t}): did the gateway's \
                 gateway.train_temperature change during the run?"
            ),
            Some(_) => {}
        }
    }
    Ok(())
}

fn to_trainer(s: Sample, token_versions: Option<Vec<u64>>) -> rl::Sample {
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
        token_versions,
        ref_logprobs: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_trainer_scores_at_the_temperature_the_gateway_recorded() {
        let mut sampled = None;
        adopt_temperatures(&mut sampled, 1.0, &[]).unwrap();
        assert_eq!(sampled, None, "no record says: the config's");
        adopt_temperatures(&mut sampled, 1.0, &[0.7]).unwrap();
        assert_eq!(sampled, Some(0.7), "the record wins over the config");
        adopt_temperatures(&mut sampled, 1.0, &[0.7]).unwrap();
        let e = adopt_temperatures(&mut sampled, 1.0, &[0.9]).unwrap_err();
        assert!(e.to_string().contains("two temperatures"), "{e}");
    }

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

    #[test]
    fn a_samples_tokens_take_the_versions_of_the_calls_it_merges() {
        // Call 0 was updated mid-way (versions 4, 4, 5); call 1 ran on 5.
        let call = |index: u32, ids: &[u32], version: u64, versions: Option<&[u64]>| {
            let mut c = serde_json::json!({
                "index": index, "api": "chat_completions", "request": {}, "response": {},
                "prompt_ids": [1], "response_ids": ids,
                "response_logprobs": vec![-0.5; ids.len()], "weight_version": version,
            });
            if let Some(v) = versions {
                c["response_versions"] = serde_json::json!(v);
            }
            serde_json::from_value::<ModelCall>(c).unwrap()
        };
        let calls = [
            call(0, &[7, 8, 9], 4, Some(&[4, 4, 5])),
            call(1, &[10, 11], 5, None),
        ];
        // Response: call 0's tokens, a 2-token tool result, call 1's.
        let sample: Sample = serde_json::from_value(serde_json::json!({
            "prompt_ids": [1], "response_ids": [7, 8, 9, 20, 21, 10, 11],
            "trainable": [{"start": 0, "end": 3}, {"start": 5, "end": 7}],
            "logprobs": [-0.5, -0.5, -0.5, 0.0, 0.0, -0.5, -0.5],
            "source_calls": [0, 1], "weight_version": 4,
            "agent": null, "break_before": null,
        }))
        .unwrap();
        assert_eq!(
            token_versions(&sample, &calls),
            Some(vec![4, 4, 5, 4, 4, 5, 5])
        );
        // Spans that are not the calls' tokens: the sample's version stands.
        let mut other = sample.clone();
        other.trainable.pop();
        assert_eq!(token_versions(&other, &calls), None);
        // Calls of one version each still tell their tokens apart...
        let whole = [call(0, &[7, 8, 9], 4, None), call(1, &[10, 11], 5, None)];
        assert_eq!(
            token_versions(&sample, &whole),
            Some(vec![4, 4, 4, 4, 4, 5, 5])
        );
        // ...and a sample of one version needs none.
        let one = [call(0, &[7, 8, 9], 4, None), call(1, &[10, 11], 4, None)];
        assert_eq!(token_versions(&sample, &one), None);
    }
}

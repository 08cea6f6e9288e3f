//! A finished rollout, from the store through the plugins, to what the
//! trainer takes: samples from the adapter plugin, a reward from the reward
//! plugin, and how the rollout ended (system failures are never scored).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use agl_trainer::rl::{self, Outcome};

use crate::config::{Config, plugin_name};
use crate::controller::is_system_reason;
use crate::plugin::{HostConfig, Plugin, PluginHost, PluginSpec, World};
use crate::rollout::{Rollout, RolloutStatus, Sample};
use crate::store::Store;
use crate::tokenizer::Tokenizer;

/// The run's sample-adapter plugin and (optional) reward plugin.
pub struct Plugins {
    pub adapter: Plugin,
    pub reward: Option<Plugin>,
}

impl Plugins {
    pub async fn load(
        config: &Config,
        adapter: &Path,
        reward: Option<&Path>,
        tokenizer: Option<Arc<Tokenizer>>,
    ) -> anyhow::Result<Plugins> {
        let host = plugin_host(config)?;
        let adapter = load(
            &host,
            config,
            adapter,
            tokenizer.clone(),
            World::SampleAdapter,
        )
        .await?;
        let reward = match reward {
            Some(p) => Some(load(&host, config, p, tokenizer, World::Reward).await?),
            None => None,
        };
        Ok(Plugins { adapter, reward })
    }
}

/// A plugin host with the config's component cache.
pub fn plugin_host(config: &Config) -> anyhow::Result<PluginHost> {
    let mut host_config = HostConfig::default();
    if let Some(dir) = &config.plugins.cache_dir {
        host_config.cache_dir = Some(dir.clone());
    }
    Ok(PluginHost::new(host_config)?)
}

/// Loads `path` and checks it implements `want`.
pub async fn load(
    host: &PluginHost,
    config: &Config,
    path: &Path,
    tokenizer: Option<Arc<Tokenizer>>,
    want: World,
) -> anyhow::Result<Plugin> {
    let mut spec = PluginSpec::new(plugin_name(path), path);
    spec.config = config.plugin_table(path);
    spec.limits = config.plugins.limits;
    spec.tokenizer = tokenizer;
    let plugin = host.load(spec).await?;
    anyhow::ensure!(
        plugin.world() == want,
        "{} is a {} plugin, expected {}",
        path.display(),
        plugin.world().as_str(),
        want.as_str()
    );
    Ok(plugin)
}

/// One finished rollout as the trainer sees it, plus what the report counts.
pub struct Collected {
    pub rollout: rl::Rollout,
    /// Chain breaks by class (`retokenize`, `template`, `other`).
    pub breaks: BTreeMap<String, usize>,
    /// The adapter or reward plugin failed: the rollout is excluded.
    pub plugin_failed: bool,
}

/// How the controller says `status` / `reason` ended.
pub fn outcome(status: RolloutStatus, reason: Option<&str>) -> Outcome {
    match status {
        RolloutStatus::Succeeded => Outcome::Succeeded,
        RolloutStatus::Failed if !is_system_reason(reason) => Outcome::AgentFailure,
        // Cancelled, system-failed (or, defensively, not terminal).
        _ => Outcome::SystemFailure,
    }
}

/// Reads rollout `id` from the store and runs the plugins over it. Plugin
/// errors exclude the rollout (logged), they never stop the run.
pub async fn collect(store: &Store, plugins: &Plugins, id: &str) -> anyhow::Result<Collected> {
    let rec = store.get_rollout(id).await?;
    let mut out = Collected {
        rollout: rl::Rollout {
            id: rec.id.clone(),
            group_id: rec.group_id.clone(),
            reward: None,
            outcome: outcome(rec.status, rec.reason.as_deref()),
            samples: Vec::new(),
        },
        breaks: BTreeMap::new(),
        plugin_failed: false,
    };
    if out.rollout.outcome == Outcome::SystemFailure {
        return Ok(out);
    }
    let exported = store.export_rollout(id).await?;
    match plugins.adapter.build_samples(&exported).await {
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
    match score(plugins, &exported).await {
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

/// The reward plugin's score; without a reward plugin, the harness's own
/// last `reward` event.
pub async fn score(plugins: &Plugins, rollout: &Rollout) -> anyhow::Result<Option<f64>> {
    match &plugins.reward {
        Some(p) => Ok(p.reward(rollout).await?),
        None => Ok(reported_reward(rollout)),
    }
}

fn reported_reward(rollout: &Rollout) -> Option<f64> {
    rollout.events.iter().rev().find_map(|e| {
        if e.kind != "reward" {
            return None;
        }
        let v = e.payload.parse().ok()?;
        v.as_f64()
            .or_else(|| v.get("reward").and_then(serde_json::Value::as_f64))
    })
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

    #[test]
    fn system_failures_and_cancellations_are_not_scored() {
        use RolloutStatus::*;
        assert_eq!(outcome(Succeeded, None), Outcome::Succeeded);
        assert_eq!(outcome(Failed, Some("exit code 1")), Outcome::AgentFailure);
        assert_eq!(
            outcome(Failed, Some("system: timed out after 300 s")),
            Outcome::SystemFailure
        );
        assert_eq!(outcome(Cancelled, None), Outcome::SystemFailure);
    }
}

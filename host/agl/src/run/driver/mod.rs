//! The training loop of `agl run` and `agl train`: launch groups of
//! rollouts, wait for the scheduler to hand over complete groups, train,
//! publish the new weights, validate, checkpoint. Each job is its own part:
//! `groups.rs` (launching, seeing groups end, collecting them, dropping the
//! stale), the update here (`train_on`), `publish.rs` (pause, drain,
//! reload, record, resume), `validate.rs`, `checkpoint.rs`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use agl_rl::{self as rl, GroupScheduler, Outcome, StaleTokens, build_update};

use super::collect::{Collected, TurnTally};
use super::data::{Cursor, Dataset};
use super::report::{MetricsLog, Progress, StepRecord, TrainerGauges, TrainerStats};
use crate::config::{InFlightMode, RunConfig, TrainConfig};
use crate::link::{Link, WAKE};
use crate::plugins::Plugins;
use crate::policy::Policy;
use agl_rl::Trainer;

mod checkpoint;
mod groups;
mod publish;
mod validate;

/// A group's rollouts once all of them ended.
pub struct DoneGroup {
    rollouts: Vec<Collected>,
}

/// A launched group the loop still tracks (in flight or complete, not yet
/// trained). Saved in checkpoints so a resumed run picks them up again.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Tracked {
    key: String,
    version: u64,
    rollouts: Vec<String>,
    done: bool,
}

/// What a checkpoint keeps besides weights and optimizer state.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct HostState {
    cursor: Cursor,
    launched: u64,
    groups: Vec<Tracked>,
}

/// What the loop works with.
pub struct Parts {
    pub cfg: RunConfig,
    pub train: TrainConfig,
    /// This config's `[gateway] train_temperature`: what the trainer scores
    /// at until a record says what the gateway sampled at.
    pub temperature: f64,
    /// The gateway side: its store and proxy, in this process or not.
    pub link: Arc<dyn Link>,
    /// Put before every rollout id the loop makes: a gateway that outlives
    /// one run (`agl train`) never hands a run another run's rollouts.
    pub id_prefix: String,
    pub policy: Policy,
    pub trainer: Trainer,
    pub plugins: Arc<Plugins>,
    pub data: Dataset,
    pub metrics: MetricsLog,
    pub gauges: Arc<TrainerGauges>,
    pub progress: Progress,
}

/// Where the loop starts: fresh, or a checkpoint's step, version and state.
#[derive(Default)]
pub struct Start {
    pub step: u64,
    pub version: u64,
    pub state: HostState,
}

pub struct Driver {
    cfg: RunConfig,
    train: TrainConfig,
    temperature: f64,
    /// The temperature the gateway recorded sampling the calls at.
    sampled: Option<f64>,
    link: Arc<dyn Link>,
    id_prefix: String,
    policy: Policy,
    trainer: Trainer,
    plugins: Arc<Plugins>,
    data: Dataset,
    metrics: MetricsLog,
    gauges: Arc<TrainerGauges>,
    progress: Progress,
    started: Instant,
    /// Updates done.
    step: u64,
    /// The weight version the engine serves: +1 per applied update, and
    /// never reused (a resumed run continues after the newest recorded one).
    version: u64,
    state: HostState,
    sched: GroupScheduler<DoneGroup>,
    tracked: BTreeMap<String, Tracked>,
    carried: Vec<Vec<rl::ScoredRollout>>,
    /// The store's change counter when the loop last looked.
    seen: u64,
}

impl Driver {
    pub fn new(parts: Parts, start: Start) -> anyhow::Result<Driver> {
        let Parts {
            cfg,
            train,
            temperature,
            link,
            id_prefix,
            policy,
            trainer,
            plugins,
            data,
            metrics,
            gauges,
            progress,
        } = parts;
        let Start {
            step,
            version,
            state,
        } = start;
        let mut sched = GroupScheduler::new(cfg.schedule())?;
        let mut tracked = BTreeMap::new();
        for g in &state.groups {
            // Complete groups are collected again from the store.
            if let Err(e) = sched.launched(g.key.clone(), g.version) {
                tracing::warn!(group = %g.key, error = %e, "not resumed");
                continue;
            }
            tracked.insert(
                g.key.clone(),
                Tracked {
                    done: false,
                    ..g.clone()
                },
            );
        }
        Ok(Driver {
            cfg,
            train,
            temperature,
            sampled: None,
            link,
            id_prefix,
            policy,
            trainer,
            plugins,
            data,
            metrics,
            gauges,
            progress,
            started: Instant::now(),
            step,
            version,
            state,
            sched,
            tracked,
            carried: Vec::new(),
            seen: 0,
        })
    }

    /// Updates done.
    pub fn step(&self) -> u64 {
        self.step
    }

    /// Clears the progress bar (the run's end).
    pub fn finish_progress(&self) {
        self.progress.finish();
    }

    /// The TensorBoard / W&B export, to close at the run's end.
    pub fn take_export(&mut self) -> Option<super::report::Export> {
        self.metrics.take_export()
    }

    /// Runs until `cfg.steps` updates are done or `stop` is set.
    pub async fn run(&mut self, stop: &tokio::sync::watch::Receiver<bool>) -> anyhow::Result<()> {
        if self.step == 0 && self.cfg.val_every > 0 {
            let val = self.validate(stop).await?;
            let elapsed = self.started.elapsed().as_secs_f64();
            let mut record = StepRecord::baseline(self.cfg.steps, elapsed, None, 0);
            val.record_into(&mut record);
            self.report(&record)?;
        }
        while self.step < self.cfg.steps && !*stop.borrow() {
            let t0 = Instant::now();
            let Some(update) = self.wait_for_update(stop).await? else {
                break;
            };
            let wait_s = t0.elapsed().as_secs_f64();
            let mut record = self.train_on(update).await?;
            record.wait_s = wait_s;
            if self.cfg.val_every > 0
                && (self.step.is_multiple_of(self.cfg.val_every) || self.step == self.cfg.steps)
            {
                let val = self.validate(stop).await?;
                val.record_into(&mut record);
            }
            record.step_s = t0.elapsed().as_secs_f64();
            record.elapsed_s = self.started.elapsed().as_secs_f64();
            self.report(&record)?;
            let every = self.cfg.checkpoint_every;
            if (every > 0 && self.step.is_multiple_of(every)) || self.step == self.cfg.steps {
                self.checkpoint().await?;
            }
        }
        Ok(())
    }

    fn report(&mut self, record: &StepRecord) -> anyhow::Result<()> {
        self.metrics.append(record)?;
        self.gauges.set(record);
        self.progress.step_done(record);
        Ok(())
    }

    /// Launches what the scheduler allows and polls until it hands over an
    /// update; `None` when stopped.
    async fn wait_for_update(
        &mut self,
        stop: &tokio::sync::watch::Receiver<bool>,
    ) -> anyhow::Result<Option<rl::Update<DoneGroup>>> {
        loop {
            if *stop.borrow() {
                return Ok(None);
            }
            let quota = self.sched.launch_quota();
            for _ in 0..quota {
                self.launch_group().await?;
            }
            self.poll_groups().await?;
            if let Some(update) = self.sched.next_update(self.version) {
                return Ok(Some(update));
            }
            self.seen = self.link.wait_change(self.seen, WAKE).await?;
        }
    }

    /// Builds the batch, takes the optimizer step, and hands the engine the
    /// new weights.
    async fn train_on(&mut self, update: rl::Update<DoneGroup>) -> anyhow::Result<StepRecord> {
        let mut record = StepRecord {
            total_steps: self.cfg.steps,
            dropped_stale: update.dropped_stale.len(),
            ..StepRecord::default()
        };
        for (key, _) in &update.dropped_stale {
            self.tracked.remove(key);
        }
        let mut staleness = Vec::new();
        let mut turns = TurnTally::default();
        let mut rollouts: Vec<rl::ScoredRollout> = self.carried.drain(..).flatten().collect();
        for (key, version, group) in update.groups {
            self.tracked.remove(&key);
            staleness.push(self.version.saturating_sub(version) as f64);
            for c in group.rollouts {
                if c.plugin_failed {
                    record.plugin_failures += 1;
                }
                for (kind, n) in c.breaks {
                    *record.breaks.entry(kind).or_default() += n;
                }
                for p in c.plugins {
                    if !record.plugins.contains(&p) {
                        record.plugins.push(p);
                    }
                }
                if c.rollout.outcome != Outcome::SystemFailure {
                    turns.add(c.turns);
                }
                rollouts.push(c.rollout);
            }
        }
        record.mean_staleness = mean(&staleness).unwrap_or(0.0);
        record.calls_per_rollout = turns.calls_per_rollout();
        record.tool_use = turns.tool_use();
        let mut batch_cfg = self.train.batch();
        if self.cfg.in_flight == InFlightMode::Continue {
            // The update trains the policy of `self.version`.
            batch_cfg.stale_tokens = self.cfg.max_staleness.map(|max| StaleTokens {
                current: self.version,
                max,
            });
        }
        let prepared = build_update(rollouts, &batch_cfg)?;
        record.set_batch_stats(&prepared.stats);
        self.carried = prepared.carried;
        let batch = prepared.batch;
        if batch.samples.is_empty() {
            tracing::warn!(
                step = self.step + 1,
                "no trainable samples in this update; weights unchanged"
            );
            self.step += 1;
            record.step = self.step;
            record.weight_version = self.version;
            record.dropped_stale += self.after_update().await?;
            return Ok(record);
        }
        self.progress.set_phase("training");
        let t = Instant::now();
        let step_cfg = self.train.step(self.sampled.unwrap_or(self.temperature));
        let s = self.trainer.train(batch, step_cfg).await?;
        record.train_s = t.elapsed().as_secs_f64();
        record.set_step_stats(&s);

        record.drain_s = self.publish().await?;
        record.step = self.step;
        record.weight_version = self.version;
        record.dropped_stale += self.after_update().await?;
        Ok(record)
    }
}

fn mean(xs: &[f64]) -> Option<f64> {
    (!xs.is_empty()).then(|| xs.iter().sum::<f64>() / xs.len() as f64)
}

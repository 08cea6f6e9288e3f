//! The training loop of `agl run`: launch groups of rollouts, wait for the
//! scheduler to hand over complete groups, train, push the new weights to
//! the engine behind a paused and drained gateway, validate, checkpoint.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::json;

use agl_trainer::checkpoint::CheckpointMeta;
use agl_trainer::rl::{self, GroupScheduler, Outcome, build_update};

use super::collect::{Collected, TurnTally, Turns, collect};
use super::data::{Cursor, Dataset};
use super::report::{MetricsLog, Progress, StepRecord, TrainerGauges, TrainerStats};
use crate::config::{RunConfig, TrainConfig};
use crate::link::Link;
use crate::plugins::{Plugins, score};
use crate::policy::Policy;
use crate::trainer::Trainer;
use agl_wire::api::NewRollout;
use agl_wire::rollout::{JsonText, Mode};

/// The longest the loop sleeps between two looks at its rollouts: it is
/// woken by the store's change counter sooner (`Link::wait_change`).
const WAKE: Duration = Duration::from_secs(1);

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
    /// The gateway's training temperature (what the trainer scores at).
    pub temperature: f64,
    /// The gateway side: its store and proxy, in this process or not.
    pub link: Arc<Link>,
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
    link: Arc<Link>,
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
            link,
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

    async fn launch_group(&mut self) -> anyhow::Result<()> {
        let row = self.state.cursor.next(self.data.train.len(), self.cfg.seed);
        let input = JsonText::from(&self.data.train[row]);
        let key = format!("g{:06}", self.state.launched);
        self.state.launched += 1;
        let batch: Vec<NewRollout> = (0..self.cfg.group_size)
            .map(|i| NewRollout {
                id: Some(format!("{key}-r{i}")),
                group_id: key.clone(),
                mode: Mode::Train,
                input: input.clone(),
                config: JsonText::default(),
            })
            .collect();
        // Idempotent: a resumed run re-creates the same ids and adopts them.
        let rollouts = self.link.create(batch).await?;
        self.progress.rollouts_launched(rollouts.len() as u64);
        self.sched.launched(key.clone(), self.version)?;
        self.tracked.insert(
            key.clone(),
            Tracked {
                key,
                version: self.version,
                rollouts,
                done: false,
            },
        );
        Ok(())
    }

    /// Completes every tracked group whose rollouts have all ended for good.
    async fn poll_groups(&mut self) -> anyhow::Result<()> {
        let pending: Vec<Tracked> = self.tracked.values().filter(|g| !g.done).cloned().collect();
        let mut done = Vec::new();
        for g in pending {
            if !self.all_final(&g.rollouts).await? {
                continue;
            }
            let mut rollouts = Vec::with_capacity(g.rollouts.len());
            for id in &g.rollouts {
                let c = collect(&self.link, &self.plugins, id).await?;
                self.progress
                    .rollout_finished(c.rollout.outcome != Outcome::SystemFailure);
                rollouts.push(c);
            }
            if let Some(t) = self.tracked.get_mut(&g.key) {
                t.done = true;
            }
            done.push((g.key, DoneGroup { rollouts }));
        }
        // Seen finishing in one pass: queued in launch order.
        self.sched.completed_together(done)?;
        Ok(())
    }

    /// Whether every rollout ended and will not be retried.
    async fn all_final(&self, ids: &[String]) -> anyhow::Result<bool> {
        for id in ids {
            // The store re-queues a system failure while its retry budget
            // lasts: an ended rollout has ended for good.
            if !self.link.status(id).await?.is_terminal() {
                return Ok(false);
            }
        }
        Ok(true)
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
        let prepared = build_update(rollouts, &self.train.batch())?;
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
        let step_cfg = self.train.step(self.temperature);
        let s = self.trainer.train(batch, step_cfg).await?;
        record.train_s = t.elapsed().as_secs_f64();
        record.set_step_stats(&s);

        let t = Instant::now();
        self.step += 1;
        self.version += 1;
        self.link.pause().await?;
        let stuck = self
            .link
            .drain(Duration::from_secs(self.cfg.drain_timeout_secs))
            .await?;
        if stuck > 0 {
            tracing::warn!(
                calls = stuck,
                "drain timed out; updating with calls in flight"
            );
        }
        let drained_s = t.elapsed().as_secs_f64();
        let pushed = self.policy.update(&self.trainer, self.version).await;
        let recorded = match &pushed {
            Ok(()) => {
                let meta = json!({
                    "step": self.step,
                    "trained": true,
                    "paused": true,
                    "drain_s": drained_s,
                    "in_flight_after_drain": stuck,
                    "update_s": t.elapsed().as_secs_f64() - drained_s,
                });
                self.publish_version(&meta).await
            }
            Err(_) => Ok(()),
        };
        // A failed reload leaves the proxy paused: the engine serves the
        // previous version, which no new call may be recorded under the new
        // number; agents wait on 429s while the run stops with the error.
        if let Err(e) = pushed {
            return Err(e.context(format!(
                "the engine did not take weight version {}; the proxy stays paused and \
                 the engine serves version {}",
                self.version,
                self.version - 1
            )));
        }
        self.link.resume().await?;
        recorded?;
        record.drain_s = t.elapsed().as_secs_f64();
        record.step = self.step;
        record.weight_version = self.version;
        record.dropped_stale += self.after_update().await?;
        Ok(record)
    }

    /// The update's groups free their slots; groups now too stale to train
    /// are dropped (complete ones) or cancelled (in flight). Returns how
    /// many groups were dropped.
    async fn after_update(&mut self) -> anyhow::Result<usize> {
        self.sched.finish_update()?;
        let stale = self.sched.take_stale(self.version);
        for (key, _) in &stale {
            self.tracked.remove(key);
        }
        let cancelled = self.sched.cancel_stale_in_flight(self.version);
        for key in &cancelled {
            if let Some(g) = self.tracked.remove(key) {
                self.cancel(&g.rollouts).await;
            }
        }
        Ok(stale.len() + cancelled.len())
    }

    /// Records the engine's new weight version: calls recorded from now on
    /// carry it. The store refuses a version twice.
    async fn publish_version(&self, meta: &serde_json::Value) -> anyhow::Result<()> {
        self.link.record_version(self.version, meta).await
    }

    /// Runs the val rows once (the gateway samples them at the val
    /// temperature): the mean reward over scored rollouts and their turns.
    async fn validate(
        &mut self,
        stop: &tokio::sync::watch::Receiver<bool>,
    ) -> anyhow::Result<Validation> {
        let rows: Vec<_> = self
            .data
            .val
            .iter()
            .take(self.cfg.val_size)
            .cloned()
            .collect();
        if rows.is_empty() {
            return Ok(Validation::default());
        }
        self.progress
            .set_phase(&format!("validating on {} rows", rows.len()));
        let mut batch = Vec::with_capacity(rows.len());
        for (i, row) in rows.iter().enumerate() {
            let id = format!("val{:04}-{i:04}", self.step);
            batch.push(NewRollout {
                id: Some(id.clone()),
                group_id: id,
                mode: Mode::Val,
                input: JsonText::from(row),
                config: JsonText::default(),
            });
        }
        let ids = self.link.create(batch).await?;
        while !self.all_final(&ids).await? {
            if *stop.borrow() {
                return Ok(Validation::default());
            }
            self.seen = self.link.wait_change(self.seen, WAKE).await?;
        }
        let mut rewards = Vec::new();
        let mut turns = TurnTally::default();
        for id in &ids {
            let exported = self.link.export(id).await?;
            if super::collect::outcome(exported.status, exported.failure) == Outcome::SystemFailure
            {
                continue;
            }
            match score(self.plugins.reward().as_ref(), &exported).await {
                Ok(Some(r)) => {
                    rewards.push(r);
                    turns.add(Turns::of(&exported));
                }
                Ok(None) => {}
                Err(e) => tracing::warn!(rollout = %id, error = %e, "val reward failed"),
            }
        }
        Ok(Validation {
            reward: mean(&rewards),
            rollouts: rewards.len(),
            turns,
        })
    }

    async fn checkpoint(&mut self) -> anyhow::Result<()> {
        // Carried groups are not in the checkpoint: a resume re-collects
        // only tracked groups, so keep their keys tracked until trained.
        self.state.groups = self.tracked.values().cloned().collect();
        for group in &self.carried {
            if let Some(first) = group.first() {
                self.state.groups.push(Tracked {
                    key: first.group_id.clone(),
                    version: self.version,
                    rollouts: group.iter().map(|r| r.id.clone()).collect(),
                    done: false,
                });
            }
        }
        let meta = CheckpointMeta {
            step: self.step,
            weight_version: self.version,
            created_ms: now_ms(),
            host_state: serde_json::to_value(&self.state)?,
        };
        let root = self.cfg.out_dir().join("checkpoints");
        let path = self
            .trainer
            .checkpoint(&root, meta, self.cfg.keep_checkpoints.max(1))
            .await?;
        tracing::info!(step = self.step, path = %path.display(), "checkpoint saved");
        Ok(())
    }

    /// Cancels rollouts still running (async groups beyond the last update),
    /// so the controller stops their agents.
    pub async fn cancel_in_flight(&self) {
        for g in self.tracked.values().filter(|g| !g.done) {
            self.cancel(&g.rollouts).await;
        }
    }

    async fn cancel(&self, ids: &[String]) {
        for id in ids {
            if let Err(e) = self.link.cancel(id).await {
                tracing::debug!(rollout = %id, error = %e, "not cancelled");
            }
        }
    }
}

/// What a validation measured, over its scored rollouts.
#[derive(Debug, Default)]
pub struct Validation {
    pub reward: Option<f64>,
    pub rollouts: usize,
    pub turns: TurnTally,
}

impl Validation {
    fn record_into(&self, record: &mut StepRecord) {
        record.val_reward = self.reward;
        record.val_rollouts = self.rollouts;
        record.val_calls_per_rollout = self.turns.calls_per_rollout();
        record.val_tool_use = self.turns.tool_use();
    }
}

fn mean(xs: &[f64]) -> Option<f64> {
    (!xs.is_empty()).then(|| xs.iter().sum::<f64>() / xs.len() as f64)
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

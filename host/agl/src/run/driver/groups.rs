//! Groups: launching them, seeing them end, collecting them, and dropping
//! or cancelling the ones an update leaves too stale.

use agl_rl::Outcome;
use agl_wire::api::NewRollout;
use agl_wire::rollout::{JsonText, Mode};

use super::{DoneGroup, Driver, Tracked};
use crate::rollout_set::RolloutSet;
use crate::run::collect::{adopt_temperatures, collect};

impl Driver {
    pub(super) async fn launch_group(&mut self) -> anyhow::Result<()> {
        let row = self.state.cursor.next(self.data.train.len(), self.cfg.seed);
        let input = JsonText::from(&self.data.train[row]);
        let key = format!("{}g{:06}", self.id_prefix, self.state.launched);
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
        let set = RolloutSet::launch(self.link.as_ref(), batch).await?;
        let rollouts = set.ids().to_vec();
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
    pub(super) async fn poll_groups(&mut self) -> anyhow::Result<()> {
        let pending: Vec<Tracked> = self.tracked.values().filter(|g| !g.done).cloned().collect();
        let mut done = Vec::new();
        for g in pending {
            let set = RolloutSet::of_group(&g.key, g.rollouts.clone());
            if !set.all_ended(self.link.as_ref()).await? {
                continue;
            }
            let mut rollouts = Vec::with_capacity(g.rollouts.len());
            for id in &g.rollouts {
                let c = collect(self.link.as_ref(), &self.plugins, id).await?;
                adopt_temperatures(&mut self.sampled, self.temperature, &c.temperatures)?;
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

    /// The update's groups free their slots; groups now too stale to train
    /// are dropped (complete ones) or cancelled (in flight). Returns how
    /// many groups were dropped.
    pub(super) async fn after_update(&mut self) -> anyhow::Result<usize> {
        self.sched.finish_update()?;
        let stale = self.sched.take_stale(self.version);
        for (key, _) in &stale {
            self.tracked.remove(key);
        }
        let cancelled = self.sched.cancel_stale_in_flight(self.version);
        for key in &cancelled {
            if let Some(g) = self.tracked.remove(key) {
                RolloutSet::of_group(&g.key, g.rollouts)
                    .cancel(self.link.as_ref())
                    .await;
            }
        }
        Ok(stale.len() + cancelled.len())
    }

    /// Cancels rollouts still running (async groups beyond the last update),
    /// so the controller stops their agents.
    pub async fn cancel_in_flight(&self) {
        for g in self.tracked.values().filter(|g| !g.done) {
            RolloutSet::of_group(&g.key, g.rollouts.clone())
                .cancel(self.link.as_ref())
                .await;
        }
    }
}

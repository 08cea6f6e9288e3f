//! Validation: the val rows once, at the val temperature, scored like
//! training rollouts.

use agl_wire::api::NewRollout;
use agl_wire::rollout::{JsonText, Mode};

use super::{Driver, mean};
use crate::rollout_set::RolloutSet;
use crate::run::collect::{TurnTally, Turns, scored};
use crate::run::report::StepRecord;

impl Driver {
    /// Runs the val rows once (the gateway samples them at the val
    /// temperature): the mean reward over scored rollouts and their turns.
    pub(super) async fn validate(
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
        // One group per validation pass: it is waited for with one query.
        let group = format!("{}val{:04}", self.id_prefix, self.step);
        let batch = (rows.iter().enumerate())
            .map(|(i, row)| NewRollout {
                id: Some(format!("{group}-{i:04}")),
                group_id: group.clone(),
                mode: Mode::Val,
                input: JsonText::from(row),
                config: JsonText::default(),
            })
            .collect();
        let link = self.link.as_ref();
        let set = RolloutSet::launch(link, batch).await?;
        if !set.wait(link, &mut self.seen, stop, |_| {}).await? {
            return Ok(Validation::default());
        }
        let mut rewards = Vec::new();
        let mut turns = TurnTally::default();
        let reward = self.plugins.reward();
        for id in set.ids() {
            if let Some((r, exported)) = scored(link, reward.as_ref(), id).await? {
                rewards.push(r);
                turns.add(Turns::of(&exported));
            }
        }
        Ok(Validation {
            reward: mean(&rewards),
            rollouts: rewards.len(),
            turns,
        })
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
    pub(super) fn record_into(&self, record: &mut StepRecord) {
        record.val_reward = self.reward;
        record.val_rollouts = self.rollouts;
        record.val_calls_per_rollout = self.turns.calls_per_rollout();
        record.val_tool_use = self.turns.tool_use();
    }
}

//! Rollouts launched together and waited for together: a training group,
//! a validation pass, an evaluation's tasks. One way to launch them, see
//! them end (one query per group, not one per rollout) and cancel them, for `agl run`, `agl train` and `agl eval` alike.

use std::collections::HashMap;

use agl_wire::api::NewRollout;
use agl_wire::rollout::RolloutStatus;

use crate::link::{Link, WAKE};

/// The ids of a set, by group, in creation order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RolloutSet {
    ids: Vec<String>,
    /// Each group's id (once, in order of first appearance).
    groups: Vec<String>,
}

impl RolloutSet {
    /// Creates `batch` (ids that exist are adopted: a resumed run launches
    /// the same ids again).
    pub async fn launch(link: &dyn Link, batch: Vec<NewRollout>) -> anyhow::Result<RolloutSet> {
        let mut groups: Vec<String> = Vec::new();
        for r in &batch {
            if !groups.contains(&r.group_id) {
                groups.push(r.group_id.clone());
            }
        }
        let ids = link.create(batch).await?;
        Ok(RolloutSet { ids, groups })
    }

    /// The set of one group's rollouts `ids` (launched before, e.g. by the
    /// run a checkpoint resumes).
    pub fn of_group(group_id: &str, ids: Vec<String>) -> RolloutSet {
        RolloutSet {
            ids,
            groups: vec![group_id.to_string()],
        }
    }

    pub fn ids(&self) -> &[String] {
        &self.ids
    }

    /// How many of the set's rollouts have ended for good (the store
    /// re-queues a system failure while its retry budget lasts: an ended
    /// rollout will not run again).
    pub async fn ended(&self, link: &dyn Link) -> anyhow::Result<usize> {
        let mut status: HashMap<String, RolloutStatus> = HashMap::new();
        for group in &self.groups {
            status.extend(link.group_statuses(group).await?);
        }
        let mut ended = 0;
        for id in &self.ids {
            let s = status
                .get(id)
                .ok_or_else(|| anyhow::anyhow!("rollout {id} is not in its group"))?;
            ended += usize::from(s.is_terminal());
        }
        Ok(ended)
    }

    pub async fn all_ended(&self, link: &dyn Link) -> anyhow::Result<bool> {
        Ok(self.ended(link).await? == self.ids.len())
    }

    /// Waits until every rollout ended (true) or `stop` is set (false),
    /// telling `progress` how many have. `seen` is the store's change
    /// counter ([`Link::wait_change`]), kept by the caller across waits.
    pub async fn wait(
        &self,
        link: &dyn Link,
        seen: &mut u64,
        stop: &tokio::sync::watch::Receiver<bool>,
        mut progress: impl FnMut(usize),
    ) -> anyhow::Result<bool> {
        loop {
            let ended = self.ended(link).await?;
            progress(ended);
            if ended == self.ids.len() {
                return Ok(true);
            }
            if *stop.borrow() {
                return Ok(false);
            }
            *seen = link.wait_change(*seen, WAKE).await?;
        }
    }

    /// Cancels every rollout of the set that still runs (the controller
    /// stops their agents); a rollout that ended is left as it is.
    pub async fn cancel(&self, link: &dyn Link) {
        for id in &self.ids {
            if let Err(e) = link.cancel(id).await {
                tracing::debug!(rollout = %id, error = %e, "not cancelled");
            }
        }
    }
}

//! Checkpoints: the trainer's weights and optimizer state, and what the
//! loop needs to resume (data cursor, tracked groups).

use agl_rl::checkpoint::CheckpointMeta;

use super::{Driver, Tracked};

impl Driver {
    pub(super) async fn checkpoint(&mut self) -> anyhow::Result<()> {
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
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

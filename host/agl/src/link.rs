//! How the training loop reaches the gateway side: in one process (`agl
//! run`: the store and the proxy's control, directly, [`Local`]) or over the
//! gateway's management API (`agl train --gateway URL`: [`GatewayClient`]).
//! Two implementations of one trait, with the same meaning either way, so
//! the loop is one piece of code (ARCHITECTURE.md, Assembly).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;

use agl_client::GatewayClient;
use agl_gateway::ProxyControl;
use agl_store::{RolloutFilter, Store};
use agl_wire::api::{Engine, NewRollout, RegisterEngine};
use agl_wire::rollout::{JsonText, Rollout, RolloutStatus};

/// How long one wait for a change lasts before the caller looks again (a
/// change wakes it sooner).
pub const WAKE: Duration = Duration::from_secs(1);

#[async_trait]
pub trait Link: Send + Sync {
    /// Creates `batch` (ids that exist are adopted): the ids, in order.
    async fn create(&self, batch: Vec<NewRollout>) -> anyhow::Result<Vec<String>>;

    /// Every rollout of group `group_id` and where it stands, in one query.
    async fn group_statuses(&self, group_id: &str) -> anyhow::Result<Vec<(String, RolloutStatus)>>;

    /// Waits up to `max` for a change of any rollout's state after
    /// generation `after` (the store's change counter); returns the
    /// generation now. Pass it back next time: a change between two calls
    /// is never missed.
    async fn wait_change(&self, after: u64, max: Duration) -> anyhow::Result<u64>;

    async fn export(&self, id: &str) -> anyhow::Result<Rollout>;

    async fn cancel(&self, id: &str) -> anyhow::Result<()>;

    /// The newest published weight version.
    async fn latest_version(&self) -> anyhow::Result<Option<u64>>;

    /// Records that the engine serves `version` (refused twice).
    async fn record_version(&self, version: u64, meta: &Value) -> anyhow::Result<()>;

    /// New calls get a retryable 429 until [`Link::resume`].
    async fn pause(&self) -> anyhow::Result<()>;

    async fn resume(&self) -> anyhow::Result<()>;

    /// Waits up to `timeout` for in-flight calls: how many were left.
    async fn drain(&self, timeout: Duration) -> anyhow::Result<usize>;

    async fn register_engine(&self, engine: &RegisterEngine) -> anyhow::Result<Engine>;

    /// The store, when the gateway runs in this process (an embedded
    /// engine is registered with it directly).
    fn local_store(&self) -> Option<&Store> {
        None
    }
}

/// `agl run`: the gateway runs in this process.
pub struct Local {
    pub store: Store,
    pub control: Arc<ProxyControl>,
}

#[async_trait]
impl Link for Local {
    async fn create(&self, batch: Vec<NewRollout>) -> anyhow::Result<Vec<String>> {
        let created = self.store.create_rollouts(batch).await?;
        Ok(created.into_iter().map(|r| r.id).collect())
    }

    async fn group_statuses(&self, group_id: &str) -> anyhow::Result<Vec<(String, RolloutStatus)>> {
        let mut out = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let filter = RolloutFilter {
                group_id: Some(group_id.to_string()),
                ..RolloutFilter::default()
            };
            let page = self
                .store
                .list_rollouts(filter, cursor.as_deref(), 1000)
                .await?;
            out.extend(page.rollouts.into_iter().map(|r| (r.id, r.status)));
            match page.next_cursor {
                Some(c) => cursor = Some(c),
                None => return Ok(out),
            }
        }
    }

    async fn wait_change(&self, after: u64, max: Duration) -> anyhow::Result<u64> {
        let mut changes = self.store.changes();
        let _ = tokio::time::timeout(max, changes.wait_for(|g| *g != after)).await;
        Ok(*changes.borrow())
    }

    async fn export(&self, id: &str) -> anyhow::Result<Rollout> {
        Ok(self.store.export_rollout(id).await?)
    }

    async fn cancel(&self, id: &str) -> anyhow::Result<()> {
        self.store.cancel(id).await?;
        Ok(())
    }

    async fn latest_version(&self) -> anyhow::Result<Option<u64>> {
        Ok(self.store.latest_weight_version().await?.map(|w| w.version))
    }

    async fn record_version(&self, version: u64, meta: &Value) -> anyhow::Result<()> {
        self.store
            .record_weight_version(version, JsonText::from(meta))
            .await?;
        Ok(())
    }

    async fn pause(&self) -> anyhow::Result<()> {
        self.control.pause();
        Ok(())
    }

    async fn resume(&self) -> anyhow::Result<()> {
        self.control.resume();
        Ok(())
    }

    async fn drain(&self, timeout: Duration) -> anyhow::Result<usize> {
        Ok(self.control.drain(timeout).await.len())
    }

    async fn register_engine(&self, engine: &RegisterEngine) -> anyhow::Result<Engine> {
        Ok(self.store.register_engine(engine).await?)
    }

    fn local_store(&self) -> Option<&Store> {
        Some(&self.store)
    }
}

/// `agl train`: a gateway elsewhere (`agl serve`).
#[async_trait]
impl Link for GatewayClient {
    async fn create(&self, batch: Vec<NewRollout>) -> anyhow::Result<Vec<String>> {
        let created = GatewayClient::create(self, batch).await?;
        Ok(created.into_iter().map(|r| r.id).collect())
    }

    async fn group_statuses(&self, group_id: &str) -> anyhow::Result<Vec<(String, RolloutStatus)>> {
        let group = self.list_group(group_id).await?;
        Ok(group.into_iter().map(|r| (r.id, r.status)).collect())
    }

    async fn wait_change(&self, after: u64, max: Duration) -> anyhow::Result<u64> {
        Ok(GatewayClient::wait_change(self, after, max).await?)
    }

    async fn export(&self, id: &str) -> anyhow::Result<Rollout> {
        Ok(GatewayClient::export(self, id).await?)
    }

    async fn cancel(&self, id: &str) -> anyhow::Result<()> {
        GatewayClient::cancel(self, id).await?;
        Ok(())
    }

    async fn latest_version(&self) -> anyhow::Result<Option<u64>> {
        Ok(self.latest_weights().await?.map(|w| w.version))
    }

    async fn record_version(&self, version: u64, meta: &Value) -> anyhow::Result<()> {
        self.record_weights(version, JsonText::from(meta)).await?;
        Ok(())
    }

    async fn pause(&self) -> anyhow::Result<()> {
        Ok(GatewayClient::pause(self).await?)
    }

    async fn resume(&self) -> anyhow::Result<()> {
        Ok(GatewayClient::resume(self).await?)
    }

    async fn drain(&self, timeout: Duration) -> anyhow::Result<usize> {
        Ok(GatewayClient::drain(self, timeout).await?)
    }

    async fn register_engine(&self, engine: &RegisterEngine) -> anyhow::Result<Engine> {
        Ok(GatewayClient::register_engine(self, engine).await?)
    }
}

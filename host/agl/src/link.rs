//! How the training loop reaches the gateway side: in one process (`agl
//! run`: the store and the proxy's control, directly) or over the gateway's
//! management API (`agl train --gateway URL`). The same calls with the same
//! meaning either way, so the loop is one piece of code
//! (ARCHITECTURE.md, Assembly).

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use agl_client::GatewayClient;
use agl_gateway::ProxyControl;
use agl_store::Store;
use agl_wire::api::{Engine, NewRollout, RegisterEngine};
use agl_wire::rollout::{JsonText, Rollout, RolloutStatus};

pub enum Link {
    /// `agl run`: the gateway runs in this process.
    Local {
        store: Store,
        control: Arc<ProxyControl>,
    },
    /// `agl train`: a gateway elsewhere (`agl serve`).
    Remote(GatewayClient),
}

impl Link {
    /// Creates `batch` (ids that exist are adopted): the ids, in order.
    pub async fn create(&self, batch: Vec<NewRollout>) -> anyhow::Result<Vec<String>> {
        Ok(match self {
            Link::Local { store, .. } => store
                .create_rollouts(batch)
                .await?
                .into_iter()
                .map(|r| r.id)
                .collect(),
            Link::Remote(c) => c.create(batch).await?.into_iter().map(|r| r.id).collect(),
        })
    }

    /// Where rollout `id` stands.
    pub async fn status(&self, id: &str) -> anyhow::Result<RolloutStatus> {
        Ok(match self {
            Link::Local { store, .. } => store.get_rollout(id).await?.status,
            Link::Remote(c) => c.get(id).await?.status,
        })
    }

    /// Waits up to `max` for a change of any rollout's state after
    /// generation `after` (the store's change counter); returns the
    /// generation now. Pass it back next time: a change between two calls
    /// is never missed.
    pub async fn wait_change(&self, after: u64, max: Duration) -> anyhow::Result<u64> {
        match self {
            Link::Local { store, .. } => {
                let mut changes = store.changes();
                let _ = tokio::time::timeout(max, changes.wait_for(|g| *g != after)).await;
                Ok(*changes.borrow())
            }
            Link::Remote(c) => Ok(c.wait_change(after, max).await?),
        }
    }

    pub async fn export(&self, id: &str) -> anyhow::Result<Rollout> {
        Ok(match self {
            Link::Local { store, .. } => store.export_rollout(id).await?,
            Link::Remote(c) => c.export(id).await?,
        })
    }

    pub async fn cancel(&self, id: &str) -> anyhow::Result<()> {
        match self {
            Link::Local { store, .. } => drop(store.cancel(id).await?),
            Link::Remote(c) => drop(c.cancel(id).await?),
        }
        Ok(())
    }

    /// The newest published weight version.
    pub async fn latest_version(&self) -> anyhow::Result<Option<u64>> {
        Ok(match self {
            Link::Local { store, .. } => store.latest_weight_version().await?,
            Link::Remote(c) => c.latest_weights().await?,
        }
        .map(|w| w.version))
    }

    /// Records that the engine serves `version` (refused twice).
    pub async fn record_version(&self, version: u64, meta: &Value) -> anyhow::Result<()> {
        let meta = JsonText::from(meta);
        match self {
            Link::Local { store, .. } => drop(store.record_weight_version(version, meta).await?),
            Link::Remote(c) => drop(c.record_weights(version, meta).await?),
        }
        Ok(())
    }

    /// New calls get a retryable 429 until [`Link::resume`].
    pub async fn pause(&self) -> anyhow::Result<()> {
        match self {
            Link::Local { control, .. } => control.pause(),
            Link::Remote(c) => c.pause().await?,
        }
        Ok(())
    }

    pub async fn resume(&self) -> anyhow::Result<()> {
        match self {
            Link::Local { control, .. } => control.resume(),
            Link::Remote(c) => c.resume().await?,
        }
        Ok(())
    }

    /// Waits up to `timeout` for in-flight calls: how many were left.
    pub async fn drain(&self, timeout: Duration) -> anyhow::Result<usize> {
        Ok(match self {
            Link::Local { control, .. } => control.drain(timeout).await.len(),
            Link::Remote(c) => c.drain(timeout).await?,
        })
    }

    pub async fn register_engine(&self, engine: &RegisterEngine) -> anyhow::Result<Engine> {
        Ok(match self {
            Link::Local { store, .. } => store.register_engine(engine).await?,
            Link::Remote(c) => c.register_engine(engine).await?,
        })
    }
}

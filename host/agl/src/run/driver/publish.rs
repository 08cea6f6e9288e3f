//! Publishing an update: the proxy paused and drained, the engine given
//! the new weights, the version recorded, the proxy resumed.

use std::time::{Duration, Instant};

use serde_json::json;

use super::Driver;

impl Driver {
    /// Publishes the trainer's weights as the next version: pauses the
    /// proxy (agents get 429 + Retry-After), drains its calls, loads the
    /// weights into the engine, records the version (every later call
    /// carries it) and resumes. Returns the seconds it took. A failed load
    /// leaves the proxy paused: the engine serves the previous version,
    /// which no new call may be recorded under the new number; agents wait
    /// on 429s while the run stops with the error.
    pub(super) async fn publish(&mut self) -> anyhow::Result<f64> {
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
        Ok(t.elapsed().as_secs_f64())
    }
    /// Records the engine's new weight version: calls recorded from now on
    /// carry it. The store refuses a version twice.
    async fn publish_version(&self, meta: &serde_json::Value) -> anyhow::Result<()> {
        self.link.record_version(self.version, meta).await
    }
}

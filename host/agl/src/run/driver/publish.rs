//! Publishing an update ([`crate::policy::publish`]) as the loop's next
//! step and weight version.

use std::time::Duration;

use super::Driver;
use crate::policy::{Publish, publish};

impl Driver {
    /// Publishes the trainer's weights as the next version; returns the
    /// seconds it took.
    pub(super) async fn publish(&mut self) -> anyhow::Result<f64> {
        self.step += 1;
        self.version += 1;
        let p = Publish {
            version: self.version,
            step: self.step,
            in_flight: self.cfg.in_flight,
            drain_timeout: Duration::from_secs(self.cfg.drain_timeout_secs),
        };
        publish(self.link.as_ref(), &self.policy, &self.trainer, &p).await
    }
}

//! Publishing an update: the proxy paused (agents get 429 + Retry-After),
//! its calls drained or left running (partial rollouts), the engine given
//! the new weights, the version recorded, the proxy resumed. `agl run` and
//! `agl train` publish through this one function.

use std::time::{Duration, Instant};

use serde_json::json;

use super::Policy;
use crate::config::InFlightMode;
use crate::link::Link;
use agl_rl::Trainer;

/// One publish: which version, after which step, and what happens to the
/// calls in flight.
pub struct Publish {
    pub version: u64,
    pub step: u64,
    pub in_flight: InFlightMode,
    /// How long a drain waits for calls before updating with them in flight.
    pub drain_timeout: Duration,
}

/// Publishes the trainer's weights as `p.version`: returns the seconds it
/// took. A failed load leaves the proxy paused: the engine serves the
/// previous version, which no new call may be recorded under the new
/// number; agents wait on 429s while the run stops with the error.
pub async fn publish(
    link: &dyn Link,
    policy: &Policy,
    trainer: &Trainer,
    p: &Publish,
) -> anyhow::Result<f64> {
    let t = Instant::now();
    link.pause().await?;
    let stuck = match p.in_flight {
        InFlightMode::Drain => link.drain(p.drain_timeout).await?,
        // Left running: the engine pauses them at a token boundary and
        // they go on under the new weights.
        InFlightMode::Continue => 0,
    };
    if stuck > 0 {
        tracing::warn!(
            calls = stuck,
            "drain timed out; updating with calls in flight"
        );
    }
    let drained_s = t.elapsed().as_secs_f64();
    let pushed = policy
        .update(trainer, p.version, p.in_flight.engine())
        .await;
    let recorded = match &pushed {
        Ok(()) => {
            let meta = json!({
                "step": p.step,
                "trained": true,
                "paused": true,
                "in_flight": p.in_flight.as_str(),
                "drain_s": drained_s,
                "in_flight_after_drain": stuck,
                "update_s": t.elapsed().as_secs_f64() - drained_s,
            });
            // Calls recorded from now on carry it; the store refuses a
            // version twice.
            link.record_version(p.version, &meta).await
        }
        Err(_) => Ok(()),
    };
    if let Err(e) = pushed {
        return Err(e.context(format!(
            "the engine did not take weight version {}; the proxy stays paused and \
             the engine serves version {}",
            p.version,
            p.version.saturating_sub(1)
        )));
    }
    link.resume().await?;
    recorded?;
    Ok(t.elapsed().as_secs_f64())
}

//! State the management API shares with the proxy: the pause flag and the
//! registry of model calls in flight. The proxy registers each call and holds
//! the returned guard until the call's event is committed; dropping the guard
//! deregisters it, so a panicking or cancelled handler cannot leak an entry.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::watch;

/// One model call the proxy is serving (the wire shape `/v1/proxy/state`
/// and a drain report).
pub use agl_wire::api::InFlightCall;

#[derive(Debug)]
pub struct ProxyControl {
    paused: AtomicBool,
    next_id: AtomicU64,
    calls: Mutex<BTreeMap<u64, InFlightCall>>,
    /// The number of calls in flight, so `drain` can wait for zero.
    count: watch::Sender<usize>,
}

impl Default for ProxyControl {
    fn default() -> Self {
        ProxyControl {
            paused: AtomicBool::new(false),
            next_id: AtomicU64::new(1),
            calls: Mutex::new(BTreeMap::new()),
            count: watch::Sender::new(0),
        }
    }
}

impl ProxyControl {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// True while new proxy calls must be refused (429 + Retry-After).
    pub fn paused(&self) -> bool {
        self.paused.load(Ordering::SeqCst)
    }

    pub fn pause(&self) {
        self.paused.store(true, Ordering::SeqCst);
    }

    pub fn resume(&self) {
        self.paused.store(false, Ordering::SeqCst);
    }

    /// Registers a call; it stays in flight until the guard drops.
    pub fn register(self: &Arc<Self>, rollout_id: &str, attempt: u32) -> CallGuard {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let call = InFlightCall {
            id,
            rollout_id: rollout_id.to_string(),
            attempt,
            started_ms: now_ms(),
        };
        let mut calls = self.lock();
        calls.insert(id, call);
        self.count.send_replace(calls.len());
        CallGuard {
            control: self.clone(),
            id,
        }
    }

    pub fn in_flight_count(&self) -> usize {
        *self.count.borrow()
    }

    pub fn in_flight(&self) -> Vec<InFlightCall> {
        self.lock().values().cloned().collect()
    }

    /// Waits until no call is in flight or `timeout` passes; returns the calls
    /// still in flight (empty = drained).
    pub async fn drain(&self, timeout: Duration) -> Vec<InFlightCall> {
        let mut rx = self.count.subscribe();
        // Either outcome is fine: the registry is read afterwards either way.
        let _ = tokio::time::timeout(timeout, rx.wait_for(|n| *n == 0)).await;
        self.in_flight()
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<u64, InFlightCall>> {
        // A panic while holding this lock leaves the map consistent (each
        // operation is one insert or remove), so poisoning is ignored.
        self.calls.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Keeps one call registered; dropping it deregisters the call.
#[derive(Debug)]
pub struct CallGuard {
    control: Arc<ProxyControl>,
    id: u64,
}

impl CallGuard {
    pub fn id(&self) -> u64 {
        self.id
    }
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        let mut calls = self.control.lock();
        calls.remove(&self.id);
        self.control.count.send_replace(calls.len());
    }
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn guards_deregister_and_drain_sees_it() {
        let control = ProxyControl::new();
        let a = control.register("r1", 1);
        let b = control.register("r2", 2);
        assert_eq!(control.in_flight_count(), 2);
        drop(a);
        let left = control.drain(Duration::from_millis(10)).await;
        assert_eq!(left.len(), 1);
        assert_eq!(left[0].rollout_id, "r2");
        assert_eq!(left[0].id, b.id());
        let waiter = {
            let control = control.clone();
            tokio::spawn(async move { control.drain(Duration::from_secs(60)).await })
        };
        drop(b);
        assert!(waiter.await.unwrap().is_empty());
        assert_eq!(control.in_flight_count(), 0);
    }

    #[test]
    fn pause_and_resume_flip_the_flag() {
        let control = ProxyControl::new();
        assert!(!control.paused());
        control.pause();
        assert!(control.paused());
        control.resume();
        assert!(!control.paused());
    }
}

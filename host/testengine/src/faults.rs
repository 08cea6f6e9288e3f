//! Injected faults: latency, error statuses, dropped connections, cut streams.

use std::sync::Mutex;
use std::time::Duration;

/// Faults to inject. Counters count down as requests consume them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Faults {
    /// Wait before the response head (every request).
    pub first_byte_latency: Duration,
    /// Wait between stream chunks.
    pub chunk_latency: Duration,
    /// Answer the next N requests with `fail_status`.
    pub fail_next: u32,
    pub fail_status: u16,
    /// Sent as `Retry-After` (seconds) with failures, when set.
    pub retry_after: Option<u32>,
    /// Drop the connection of the next N requests without a response.
    pub reset_next: u32,
    /// Cut the next N streamed responses after `close_stream_after` chunks.
    pub close_stream_next: u32,
    pub close_stream_after: usize,
}

impl Default for Faults {
    fn default() -> Self {
        Self {
            first_byte_latency: Duration::ZERO,
            chunk_latency: Duration::ZERO,
            fail_next: 0,
            fail_status: 500,
            retry_after: None,
            reset_next: 0,
            close_stream_next: 0,
            close_stream_after: 1,
        }
    }
}

/// What to do with one request, beyond latency.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Serve,
    Fail {
        status: u16,
        retry_after: Option<u32>,
    },
    Reset,
    /// Serve a stream but cut it after this many chunks.
    CutStream(usize),
}

/// One request's share of the faults.
#[derive(Debug, Clone, Copy)]
pub struct Decision {
    pub first_byte_latency: Duration,
    pub chunk_latency: Duration,
    pub action: Action,
}

/// Faults shared by all requests, changeable at run time.
#[derive(Debug, Default)]
pub(crate) struct FaultState(Mutex<Faults>);

impl FaultState {
    pub(crate) fn new(faults: Faults) -> Self {
        Self(Mutex::new(faults))
    }

    pub(crate) fn set(&self, faults: Faults) {
        *self.lock() = faults;
    }

    pub(crate) fn get(&self) -> Faults {
        self.lock().clone()
    }

    /// Takes this request's decision, consuming one count. Resets win over
    /// failures, which win over cut streams (only streams consume those).
    pub(crate) fn decide(&self, streaming: bool) -> Decision {
        let mut f = self.lock();
        let action = if f.reset_next > 0 {
            f.reset_next -= 1;
            Action::Reset
        } else if f.fail_next > 0 {
            f.fail_next -= 1;
            Action::Fail {
                status: f.fail_status,
                retry_after: f.retry_after,
            }
        } else if streaming && f.close_stream_next > 0 {
            f.close_stream_next -= 1;
            Action::CutStream(f.close_stream_after)
        } else {
            Action::Serve
        };
        Decision {
            first_byte_latency: f.first_byte_latency,
            chunk_latency: f.chunk_latency,
            action,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Faults> {
        // A panic while holding this lock leaves plain data behind; keep going.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_count_down_in_priority_order() {
        let state = FaultState::new(Faults {
            reset_next: 1,
            fail_next: 1,
            fail_status: 503,
            close_stream_next: 1,
            close_stream_after: 2,
            ..Faults::default()
        });
        assert_eq!(state.decide(true).action, Action::Reset);
        assert!(matches!(
            state.decide(true).action,
            Action::Fail { status: 503, .. }
        ));
        assert_eq!(state.decide(false).action, Action::Serve);
        assert_eq!(state.decide(true).action, Action::CutStream(2));
        assert_eq!(state.decide(true).action, Action::Serve);
    }
}

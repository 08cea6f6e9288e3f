//! Collocated-async group scheduling (ARCHITECTURE.md, Training): keep
//! `groups_in_flight` (B_async) groups of rollouts launched, train on the
//! first `groups_per_update` (B_train) complete groups, carry the rest, and
//! drop groups whose weights are more than `max_staleness` versions old.
//! Sync training is the case B_async == B_train.
//!
//! A pure state machine: the caller launches groups, reports completions and
//! weight versions; nothing here knows about HTTP, rollouts or time.
//!
//! A group holds one of the B_async slots from [`GroupScheduler::launched`]
//! until it is dropped or until the update that trains on it is applied
//! ([`GroupScheduler::finish_update`]). So with B_async == B_train nothing is
//! launched while the trainer computes, and every group is trained on the
//! weights it was sampled with (staleness 0); memory stays bounded by
//! B_async groups in every case.

use std::collections::{HashMap, VecDeque};

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScheduleConfig {
    /// B_async: groups launched and not yet trained on (or dropped).
    pub groups_in_flight: usize,
    /// B_train: complete groups per update.
    pub groups_per_update: usize,
    /// Largest `current_version - launch_version` a group may be trained
    /// with; `None` = unbounded.
    pub max_staleness: Option<u64>,
}

impl ScheduleConfig {
    /// Launch `groups`, wait for all of them, train, repeat.
    pub fn sync(groups: usize) -> Self {
        Self {
            groups_in_flight: groups,
            groups_per_update: groups,
            max_staleness: Some(0),
        }
    }

    /// `groups_in_flight >= groups_per_update >= 1`.
    pub fn validate(&self) -> Result<(), String> {
        if self.groups_per_update == 0 {
            return Err("groups_per_update must be at least 1".into());
        }
        if self.groups_in_flight < self.groups_per_update {
            return Err(format!(
                "groups_in_flight ({}) must be at least groups_per_update ({})",
                self.groups_in_flight, self.groups_per_update
            ));
        }
        Ok(())
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ScheduleError {
    #[error("invalid schedule: {0}")]
    Config(String),
    #[error("unknown or already completed group {0:?}")]
    UnknownGroup(String),
    #[error("group {0:?} is already scheduled")]
    DuplicateGroup(String),
    #[error("no launch quota left ({0} groups in flight, waiting or training)")]
    NoQuota(usize),
    #[error("no update is pending")]
    NoPendingUpdate,
    #[error("{0} update(s) pending: snapshot between updates")]
    UpdatePending(usize),
    #[error("no payload for waiting group {0:?}")]
    MissingPayload(String),
}

/// What the trainer gets from [`GroupScheduler::next_update`].
#[derive(Debug)]
pub struct Update<G> {
    /// Exactly `groups_per_update` groups: (key, launch version, payload),
    /// in completion order.
    pub groups: Vec<(String, u64, G)>,
    /// Complete groups dropped for staleness; they never count toward an
    /// update.
    pub dropped_stale: Vec<(String, G)>,
}

/// Keys and launch versions without payloads, for checkpoints; the payloads
/// of waiting groups come back from the store on [`GroupScheduler::restore`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScheduleSnapshot {
    /// (key, launch version), in launch order.
    pub in_flight: Vec<(String, u64)>,
    /// (key, launch version) of complete, untrained groups, in completion
    /// order.
    pub waiting: Vec<(String, u64)>,
}

struct Waiting<G> {
    key: String,
    version: u64,
    payload: G,
}

pub struct GroupScheduler<G> {
    cfg: ScheduleConfig,
    /// key -> (launch version, launch sequence number for tie-breaks).
    in_flight: HashMap<String, (u64, u64)>,
    /// Complete groups in completion order.
    waiting: VecDeque<Waiting<G>>,
    /// Updates handed out and not yet applied; each holds B_train slots.
    pending_updates: usize,
    next_seq: u64,
}

impl<G> GroupScheduler<G> {
    pub fn new(cfg: ScheduleConfig) -> Result<Self, ScheduleError> {
        cfg.validate().map_err(ScheduleError::Config)?;
        Ok(Self {
            cfg,
            in_flight: HashMap::new(),
            waiting: VecDeque::new(),
            pending_updates: 0,
            next_seq: 0,
        })
    }

    pub fn config(&self) -> &ScheduleConfig {
        &self.cfg
    }

    /// Groups to launch now: B_async minus the groups in flight, complete
    /// and waiting, or in a pending update.
    pub fn launch_quota(&self) -> usize {
        self.cfg.groups_in_flight.saturating_sub(self.occupied())
    }

    fn occupied(&self) -> usize {
        self.in_flight.len()
            + self.waiting.len()
            + self.pending_updates * self.cfg.groups_per_update
    }

    /// Group `key` was launched on policy weight version `version`.
    /// Errors: no quota left, or `key` already in flight or waiting.
    pub fn launched(&mut self, key: String, version: u64) -> Result<(), ScheduleError> {
        if self.launch_quota() == 0 {
            return Err(ScheduleError::NoQuota(self.occupied()));
        }
        if self.in_flight.contains_key(&key) || self.waiting.iter().any(|w| w.key == key) {
            return Err(ScheduleError::DuplicateGroup(key));
        }
        self.in_flight.insert(key, (version, self.next_seq));
        self.next_seq += 1;
        Ok(())
    }

    /// A launched group finished (all its rollouts terminal). Completion
    /// order is call order; for several groups seen finishing at once use
    /// [`Self::completed_together`].
    pub fn completed(&mut self, key: &str, payload: G) -> Result<(), ScheduleError> {
        let (version, _) = self
            .in_flight
            .remove(key)
            .ok_or_else(|| ScheduleError::UnknownGroup(key.to_string()))?;
        self.waiting.push_back(Waiting {
            key: key.to_string(),
            version,
            payload,
        });
        Ok(())
    }

    /// Groups that finished at the same moment: queued in launch order. All
    /// keys are checked first; on error nothing changes.
    pub fn completed_together(&mut self, groups: Vec<(String, G)>) -> Result<(), ScheduleError> {
        let mut seen = std::collections::HashSet::new();
        for (key, _) in &groups {
            if !self.in_flight.contains_key(key) || !seen.insert(key.as_str()) {
                return Err(ScheduleError::UnknownGroup(key.clone()));
            }
        }
        let mut groups = groups;
        groups.sort_by_key(|(key, _)| self.in_flight[key].1);
        for (key, payload) in groups {
            self.completed(&key, payload)?;
        }
        Ok(())
    }

    fn is_stale(&self, launch_version: u64, current_version: u64) -> bool {
        self.cfg
            .max_staleness
            .is_some_and(|max| current_version.saturating_sub(launch_version) > max)
    }

    /// The next training batch, when at least B_train fresh groups are
    /// complete: the first B_train in completion order, with their launch
    /// versions; every stale complete group is removed into `dropped_stale`.
    /// The rest stay carried. `None` (and nothing changes) when fewer than
    /// B_train fresh groups are complete. The batch holds its slots until
    /// [`Self::finish_update`].
    pub fn next_update(&mut self, current_version: u64) -> Option<Update<G>> {
        let fresh = self
            .waiting
            .iter()
            .filter(|w| !self.is_stale(w.version, current_version))
            .count();
        if fresh < self.cfg.groups_per_update {
            return None;
        }
        let dropped_stale = self.take_stale(current_version);
        let groups = self
            .waiting
            .drain(..self.cfg.groups_per_update)
            .map(|w| (w.key, w.version, w.payload))
            .collect();
        self.pending_updates += 1;
        Some(Update {
            groups,
            dropped_stale,
        })
    }

    /// The oldest pending update was applied (weights loaded): its groups
    /// free their slots.
    pub fn finish_update(&mut self) -> Result<(), ScheduleError> {
        if self.pending_updates == 0 {
            return Err(ScheduleError::NoPendingUpdate);
        }
        self.pending_updates -= 1;
        Ok(())
    }

    /// Removes and returns the stale complete groups (call after each weight
    /// version bump so they free their slots even without an update).
    pub fn take_stale(&mut self, current_version: u64) -> Vec<(String, G)> {
        let (stale, fresh): (Vec<_>, Vec<_>) = std::mem::take(&mut self.waiting)
            .into_iter()
            .partition(|w| self.is_stale(w.version, current_version));
        self.waiting = fresh.into();
        stale.into_iter().map(|w| (w.key, w.payload)).collect()
    }

    /// Removes the in-flight groups that are already too stale to ever be
    /// trained on, returning their keys (in launch order) so the caller can
    /// abort their rollouts. A later `completed` for them is `UnknownGroup`.
    pub fn cancel_stale_in_flight(&mut self, current_version: u64) -> Vec<String> {
        let mut stale: Vec<(u64, String)> = self
            .in_flight
            .iter()
            .filter(|(_, (version, _))| self.is_stale(*version, current_version))
            .map(|(key, (_, seq))| (*seq, key.clone()))
            .collect();
        stale.sort();
        for (_, key) in &stale {
            self.in_flight.remove(key);
        }
        stale.into_iter().map(|(_, key)| key).collect()
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// Complete groups not yet handed to an update.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    pub fn pending_updates(&self) -> usize {
        self.pending_updates
    }

    /// Keys and launch versions; only between updates (no pending update),
    /// since a batch being trained cannot be rebuilt from a checkpoint.
    pub fn snapshot(&self) -> Result<ScheduleSnapshot, ScheduleError> {
        if self.pending_updates > 0 {
            return Err(ScheduleError::UpdatePending(self.pending_updates));
        }
        let mut in_flight: Vec<_> = self.in_flight.iter().collect();
        in_flight.sort_by_key(|(_, (_, seq))| *seq);
        Ok(ScheduleSnapshot {
            in_flight: in_flight
                .into_iter()
                .map(|(key, (version, _))| (key.clone(), *version))
                .collect(),
            waiting: self
                .waiting
                .iter()
                .map(|w| (w.key.clone(), w.version))
                .collect(),
        })
    }

    /// Rebuilds a scheduler from a snapshot; `payloads` must hold every
    /// waiting group's payload (extra entries are ignored). The snapshot may
    /// exceed a smaller new B_async: then nothing is launched until enough
    /// groups are trained or dropped.
    pub fn restore(
        cfg: ScheduleConfig,
        snapshot: &ScheduleSnapshot,
        mut payloads: HashMap<String, G>,
    ) -> Result<Self, ScheduleError> {
        let mut sched = Self::new(cfg)?;
        for (key, version) in &snapshot.waiting {
            let payload = payloads
                .remove(key)
                .ok_or_else(|| ScheduleError::MissingPayload(key.clone()))?;
            if sched.waiting.iter().any(|w| &w.key == key) {
                return Err(ScheduleError::DuplicateGroup(key.clone()));
            }
            sched.waiting.push_back(Waiting {
                key: key.clone(),
                version: *version,
                payload,
            });
        }
        for (key, version) in &snapshot.in_flight {
            if sched.in_flight.contains_key(key) || sched.waiting.iter().any(|w| &w.key == key) {
                return Err(ScheduleError::DuplicateGroup(key.clone()));
            }
            sched
                .in_flight
                .insert(key.clone(), (*version, sched.next_seq));
            sched.next_seq += 1;
        }
        Ok(sched)
    }
}

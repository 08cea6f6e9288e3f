//! Discrete-event simulation of the collocated RL loop, driving the real
//! [`GroupScheduler`]: how long K updates take for a given B_async / B_train
//! on heavy-tailed (log-normal) rollout durations, and at what staleness.
//!
//! The model: each group has `group_size` rollouts, each needing a
//! log-normal amount of work (seconds); at most `max_concurrent_rollouts`
//! run at once (the rest queue, FIFO). Rollouts keep running while the
//! trainer computes a step; during the update pause (drain + weight load)
//! nothing progresses, and after it the weight version increments and the
//! scheduler's freed slots are refilled. ScoredRollout durations are drawn in
//! launch order from one seeded stream, so group i gets the same durations
//! under every schedule (common random numbers).
//!
//! An update either drains first ([`CallDrain`]: the proxy stops new model
//! calls, each running rollout's current call runs on, log-normal and at
//! most the rollout's remaining work, then the rollout waits; the drain
//! ends with the longest call), or does not (partial rollouts: calls are
//! paused at a token boundary and go on after the load). Then the weight
//! load freezes every rollout. The engine's idle share counts the load and,
//! during a drain, the share of the running rollouts that wait.

use std::collections::{HashMap, VecDeque};

use agl_rl::{GroupScheduler, ScheduleConfig, ScheduleError};

#[derive(Debug, Clone)]
pub struct SimConfig {
    pub schedule: ScheduleConfig,
    /// n: rollouts per group.
    pub group_size: usize,
    /// K: updates to simulate.
    pub updates: usize,
    /// ScoredRollout duration ~ LogNormal(mu = ln(median), sigma), in seconds.
    pub rollout_median_secs: f64,
    pub rollout_sigma: f64,
    pub train_step_secs: f64,
    /// The weight load (plus, without `drain`, a fixed drain): no rollout
    /// progresses.
    pub update_pause_secs: f64,
    /// Drain in-flight model calls before each update; `None`: they go on
    /// under the new weights (partial rollouts) or the drain is in
    /// `update_pause_secs`.
    pub drain: Option<CallDrain>,
    /// Most rollouts running at once; `None` = unlimited.
    pub max_concurrent_rollouts: Option<usize>,
    /// Abort in-flight groups as soon as they are too stale to be trained.
    pub cancel_stale_in_flight: bool,
    pub seed: u64,
}

/// The model calls a drain waits for: a running rollout's current call has
/// LogNormal(ln(median), sigma) seconds left (at most the rollout's rest).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CallDrain {
    pub call_median_secs: f64,
    pub call_sigma: f64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SimResult {
    pub wall_secs: f64,
    pub updates: usize,
    /// Over trained groups: version at the update minus launch version.
    pub mean_staleness: f64,
    pub max_staleness: u64,
    /// Complete groups dropped for staleness.
    pub dropped_groups: usize,
    /// In-flight groups aborted for staleness.
    pub cancelled_groups: usize,
    pub launched_groups: usize,
    /// Share of the wall time the trainer waited for data.
    pub trainer_idle_fraction: f64,
    /// Mean drain per update, seconds (0 without [`CallDrain`]).
    pub drain_secs: f64,
    /// Share of the wall time the engine generated nothing, counted per
    /// running rollout: the weight loads, and the waits of a drain.
    pub engine_idle_fraction: f64,
}

/// xorshift64*, seeded through splitmix64 (never the all-zero state).
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        Self((z ^ (z >> 31)) | 1)
    }

    /// Uniform in [0, 1).
    fn uniform(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Standard normal (Box-Muller).
    fn normal(&mut self) -> f64 {
        let (u, v) = (1.0 - self.uniform(), self.uniform());
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
    }
}

struct Running {
    /// On the rollout clock (wall time minus pauses so far).
    finish: f64,
    group: usize,
}

struct Sim<'a> {
    cfg: &'a SimConfig,
    sched: GroupScheduler<usize>,
    rng: Rng,
    /// Call lengths, apart so rollout durations stay common random numbers.
    calls: Rng,
    /// No rollout starts while the proxy is paused.
    draining: bool,
    version: u64,
    /// Wall clock and the total paused time; rollout clock = wall - paused.
    wall: f64,
    paused: f64,
    running: Vec<Running>,
    queued: VecDeque<(usize, f64)>,
    /// Per group: rollouts not yet finished.
    remaining: Vec<usize>,
    keys: HashMap<String, usize>,
}

impl Sim<'_> {
    fn key(group: usize) -> String {
        format!("g{group}")
    }

    fn launch(&mut self) -> Result<(), ScheduleError> {
        while self.sched.launch_quota() > 0 {
            let group = self.remaining.len();
            self.sched.launched(Self::key(group), self.version)?;
            self.keys.insert(Self::key(group), group);
            self.remaining.push(self.cfg.group_size);
            for _ in 0..self.cfg.group_size {
                let z = self.rng.normal();
                let secs = self.cfg.rollout_median_secs * (self.cfg.rollout_sigma * z).exp();
                self.queued.push_back((group, secs));
            }
        }
        self.start_queued();
        Ok(())
    }

    fn start_queued(&mut self) {
        if self.draining {
            return;
        }
        let now = self.wall - self.paused;
        while self
            .cfg
            .max_concurrent_rollouts
            .is_none_or(|cap| self.running.len() < cap)
        {
            let Some((group, secs)) = self.queued.pop_front() else {
                break;
            };
            self.running.push(Running {
                finish: now + secs,
                group,
            });
        }
    }

    /// Wall time of the next rollout finish, if any runs.
    fn next_finish(&self) -> Option<f64> {
        let first = self
            .running
            .iter()
            .map(|r| r.finish)
            .min_by(f64::total_cmp)?;
        Some(first + self.paused)
    }

    /// Finishes every rollout ending at the current instant; groups whose
    /// last rollout ended complete together.
    fn finish_rollouts(&mut self) -> Result<(), ScheduleError> {
        let now = self.wall - self.paused;
        let Some(first) = self.running.iter().map(|r| r.finish).min_by(f64::total_cmp) else {
            return Ok(());
        };
        debug_assert!((first - now).abs() < 1e-6);
        let mut done = Vec::new();
        self.running.retain(|r| {
            if r.finish > first {
                return true;
            }
            done.push(r.group);
            false
        });
        let mut complete = Vec::new();
        for group in done {
            self.remaining[group] -= 1;
            if self.remaining[group] == 0 {
                complete.push((Self::key(group), group));
            }
        }
        self.sched.completed_together(complete)?;
        self.start_queued();
        Ok(())
    }

    /// Drains from the current instant: rollouts whose current call is
    /// their last finish during it, the others wait from their call's end
    /// to the drain's. Returns the drain's length and the engine-idle
    /// seconds it cost (the mean wait over the rollouts running at its start).
    fn drain(&mut self, d: CallDrain) -> Result<(f64, f64), ScheduleError> {
        let now = self.wall - self.paused;
        let n = self.running.len();
        let mut waits = Vec::with_capacity(n);
        for r in &mut self.running {
            let z = self.calls.normal();
            let call = d.call_median_secs * (d.call_sigma * z).exp();
            waits.push((r.finish - now).min(call));
        }
        let length = waits.iter().copied().fold(0.0, f64::max);
        let mut idle = 0.0;
        for (r, call) in self.running.iter_mut().zip(&waits) {
            if r.finish - now > *call {
                r.finish += length - call;
                idle += length - call;
            }
        }
        self.draining = true;
        let end = self.wall + length;
        while let Some(f) = self.next_finish().filter(|&f| f <= end) {
            self.wall = f;
            self.finish_rollouts()?;
        }
        self.wall = end;
        self.draining = false;
        Ok((length, if n > 0 { idle / n as f64 } else { 0.0 }))
    }

    fn cancel(&mut self, keys: Vec<String>) {
        for key in keys {
            if let Some(group) = self.keys.get(&key).copied() {
                self.running.retain(|r| r.group != group);
                self.queued.retain(|(g, _)| *g != group);
            }
        }
        self.start_queued();
    }
}

/// Runs the loop until `updates` updates were applied.
pub fn simulate(cfg: &SimConfig) -> Result<SimResult, ScheduleError> {
    check(cfg).map_err(ScheduleError::Config)?;
    let mut sim = Sim {
        cfg,
        sched: GroupScheduler::new(cfg.schedule.clone())?,
        rng: Rng::new(cfg.seed),
        calls: Rng::new(cfg.seed ^ 0xD1A1),
        draining: false,
        version: 0,
        wall: 0.0,
        paused: 0.0,
        running: Vec::new(),
        queued: VecDeque::new(),
        remaining: Vec::new(),
        keys: HashMap::new(),
    };
    let (mut updates, mut idle) = (0, 0.0);
    let (mut staleness_sum, mut trained, mut max_staleness) = (0u64, 0usize, 0u64);
    let (mut dropped, mut cancelled) = (0, 0);
    let (mut drained, mut engine_idle) = (0.0, 0.0);
    // Wall time the current training step ends, while one runs.
    let mut training_until: Option<f64> = None;
    sim.launch()?;
    while updates < cfg.updates {
        if training_until.is_none()
            && let Some(update) = sim.sched.next_update(sim.version)
        {
            dropped += update.dropped_stale.len();
            for (_, launch_version, _) in &update.groups {
                let staleness = sim.version - launch_version;
                staleness_sum += staleness;
                max_staleness = max_staleness.max(staleness);
                trained += 1;
            }
            training_until = Some(sim.wall + cfg.train_step_secs);
        }
        let finish = sim.next_finish();
        // On a tie, rollouts finish before the pause freezes them.
        match (finish, training_until) {
            (Some(f), t) if t.is_none_or(|t| f <= t) => {
                if t.is_none() {
                    idle += f - sim.wall;
                }
                sim.wall = f;
                sim.finish_rollouts()?;
            }
            (_, Some(t)) => {
                sim.wall = t;
                if let Some(d) = cfg.drain {
                    let (length, idle) = sim.drain(d)?;
                    drained += length;
                    engine_idle += idle;
                }
                sim.wall += cfg.update_pause_secs;
                sim.paused += cfg.update_pause_secs;
                engine_idle += cfg.update_pause_secs;
                sim.version += 1;
                sim.sched.finish_update()?;
                training_until = None;
                updates += 1;
                if updates == cfg.updates {
                    break;
                }
                dropped += sim.sched.take_stale(sim.version).len();
                if cfg.cancel_stale_in_flight {
                    let keys = sim.sched.cancel_stale_in_flight(sim.version);
                    cancelled += keys.len();
                    sim.cancel(keys);
                }
                sim.launch()?;
            }
            _ => {
                // Unreachable while the scheduler refills its slots: fewer
                // than B_train waiting leaves quota to launch.
                return Err(ScheduleError::Config(
                    "simulation stalled: nothing running and no update".into(),
                ));
            }
        }
    }
    Ok(SimResult {
        wall_secs: sim.wall,
        updates,
        mean_staleness: staleness_sum as f64 / trained.max(1) as f64,
        max_staleness,
        dropped_groups: dropped,
        cancelled_groups: cancelled,
        launched_groups: sim.remaining.len(),
        trainer_idle_fraction: if sim.wall > 0.0 { idle / sim.wall } else { 0.0 },
        drain_secs: drained / updates.max(1) as f64,
        engine_idle_fraction: if sim.wall > 0.0 {
            engine_idle / sim.wall
        } else {
            0.0
        },
    })
}

fn check(cfg: &SimConfig) -> Result<(), String> {
    cfg.schedule.validate()?;
    if cfg.group_size == 0 {
        return Err("group_size must be at least 1".into());
    }
    if cfg.max_concurrent_rollouts == Some(0) {
        return Err("max_concurrent_rollouts must be at least 1".into());
    }
    if let Some(d) = cfg.drain
        && !(d.call_median_secs > 0.0 && d.call_sigma >= 0.0 && d.call_median_secs.is_finite())
    {
        return Err("drain call lengths: the median must be > 0 and sigma >= 0".into());
    }
    let times = [
        cfg.rollout_median_secs,
        cfg.rollout_sigma,
        cfg.train_step_secs,
        cfg.update_pause_secs,
    ];
    if times.iter().any(|t| !t.is_finite() || *t < 0.0) || cfg.rollout_median_secs <= 0.0 {
        return Err("durations must be finite, >= 0, and the median > 0".into());
    }
    Ok(())
}

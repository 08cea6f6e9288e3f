//! The threads a decode step's parallel loops run on: the calling thread
//! and helpers of its own that spin between loops instead of sleeping.
//!
//! A batch-1 step is ~150 short loops a token (each matmul, attention),
//! with a little serial work between them. rayon's idle threads fall
//! asleep after a few dozen rounds with nothing to steal (rayon-core 1.13
//! has no setting for that) and each loop then woke one through a futex:
//! on 2 cores ~6% of a decode's samples were the scheduler's, on both the
//! waking and the waiting side. The helpers here poll one atomic for
//! [`SPIN`] after their last task and only then sleep, so the loops of a
//! step, and the steps of a run, hand over without a system call. (Crates
//! with spinning pools exist, none established; this is the one pattern
//! the step needs: run tasks `0..n` and wait for them.)
//!
//! Each thread that runs a loop gets its own team, made on its first loop
//! with libtorch's intra-op thread count and ended with the thread. A loop
//! inside a loop's task runs on the calling thread alone.

use std::cell::{Cell, RefCell};
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::Ordering::SeqCst;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a helper polls for the next loop before it sleeps: longer than
/// the gap between two decode steps (sampling, sending the token), short
/// enough that an idle engine gives its cores back at once.
const SPIN: Duration = Duration::from_millis(2);

/// Bits of [`Shared::state`] for the task count and the next task.
const TASK_BITS: u32 = 12;
/// Tasks in one round of a loop (more are run in rounds).
const MAX_TASKS: usize = (1 << TASK_BITS) - 1;
const TASK_MASK: u64 = (1 << TASK_BITS) - 1;

/// Runs `task(i)` for every `i` in `0..tasks` on the calling thread's team
/// and returns when all have run. A panicking task panics here, after
/// every other task has finished.
pub fn for_each(tasks: usize, task: impl Fn(usize) + Sync) {
    if tasks <= 1 || INSIDE.get() {
        (0..tasks).for_each(task);
        return;
    }
    TEAM.with(|team| {
        let mut team = team.borrow_mut();
        let team = team.get_or_insert_with(|| Team::new(default_threads()));
        INSIDE.set(true);
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            for start in (0..tasks).step_by(MAX_TASKS) {
                let n = MAX_TASKS.min(tasks - start);
                team.run(n, &|i| task(start + i));
            }
        }));
        INSIDE.set(false);
        if let Err(panic) = outcome {
            resume_unwind(panic)
        }
    });
}

/// [`for_each`] over the `chunk`-long pieces of `data` (the last may be
/// shorter): `task(i, piece i)`.
pub fn for_each_chunk_mut<T: Send>(
    data: &mut [T],
    chunk: usize,
    task: impl Fn(usize, &mut [T]) + Sync,
) {
    assert!(chunk > 0);
    let (len, base) = (data.len(), Pointer(data.as_mut_ptr()));
    for_each(len.div_ceil(chunk), |i| {
        let start = i * chunk;
        let n = chunk.min(len - start);
        // SAFETY: piece `i` is `data[start..start + n]`, within `data`
        // (borrowed mutably for the whole loop), and no two tasks share
        // a piece.
        task(i, unsafe {
            std::slice::from_raw_parts_mut(base.at(start), n)
        });
    });
}

/// A pointer the tasks of one loop share (each to its own elements).
struct Pointer<T>(*mut T);

// SAFETY: see `for_each_chunk_mut`: each task reaches disjoint elements,
// which are `Send`.
unsafe impl<T: Send> Sync for Pointer<T> {}

impl<T> Pointer<T> {
    fn at(&self, offset: usize) -> *mut T {
        self.0.wrapping_add(offset)
    }
}

/// Threads [`for_each`] runs on from this thread (itself included).
pub fn threads() -> usize {
    if INSIDE.get() {
        return 1;
    }
    TEAM.with(|team| match &*team.borrow() {
        Some(team) => team.helpers.len() + 1,
        None => default_threads(),
    })
}

fn default_threads() -> usize {
    usize::try_from(tch::get_num_threads()).unwrap_or(1).max(1)
}

thread_local! {
    static TEAM: RefCell<Option<Team>> = const { RefCell::new(None) };
    /// Set while this thread runs a loop's task, and on helpers.
    static INSIDE: Cell<bool> = const { Cell::new(false) };
}

/// One loop's task, behind a thin pointer the helpers load atomically.
struct Job<'a> {
    task: &'a (dyn Fn(usize) + Sync),
}

/// What the calling thread and its helpers share.
struct Shared {
    /// The loop now running: its number (the high bits, counting up), its
    /// task count and the next task nobody has taken. A task is taken by a
    /// compare-exchange on all three, so it belongs to the loop it was
    /// taken from.
    state: AtomicU64,
    /// That loop's [`Job`]: set before `state` announces the loop, read by
    /// a helper before it takes a task, followed only once it has one.
    job: AtomicPtr<Job<'static>>,
    /// Tasks of the running loop that have finished.
    done: AtomicUsize,
    /// Whether a helper's task panicked in the running loop.
    panicked: AtomicBool,
    stop: AtomicBool,
    /// Helpers asleep or going to sleep, so a new loop wakes them.
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
}

fn tasks_of(state: u64) -> usize {
    ((state >> TASK_BITS) & TASK_MASK) as usize
}

fn next_of(state: u64) -> usize {
    (state & TASK_MASK) as usize
}

impl Shared {
    /// Takes and runs the next task of the loop `state` says is running;
    /// false if it had none left or another thread took it first.
    fn take(&self, state: u64) -> bool {
        if next_of(state) >= tasks_of(state) {
            return false;
        }
        let job = self.job.load(SeqCst);
        if self
            .state
            .compare_exchange(state, state + 1, SeqCst, SeqCst)
            .is_err()
        {
            return false;
        }
        // SAFETY: the exchange took a task of the loop `state` names, so
        // that loop has not finished (its caller waits for `done` to count
        // this task too) and its job, stored before `state` announced it and
        // replaced only after the loop finished, is the one `job` loaded.
        let task = unsafe { (*job).task };
        if catch_unwind(AssertUnwindSafe(|| task(next_of(state)))).is_err() {
            self.panicked.store(true, SeqCst);
        }
        self.done.fetch_add(1, SeqCst);
        true
    }
}

struct Team {
    shared: Arc<Shared>,
    helpers: Vec<JoinHandle<()>>,
}

impl Team {
    /// A team of `threads` with the caller; with fewer helpers than asked
    /// for where the system gives no more threads.
    fn new(threads: usize) -> Self {
        let shared = Arc::new(Shared {
            state: AtomicU64::new(0),
            job: AtomicPtr::new(std::ptr::null_mut()),
            done: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
            lock: Mutex::new(()),
            wake: Condvar::new(),
        });
        let helpers = (1..threads)
            .map_while(|i| {
                let shared = shared.clone();
                std::thread::Builder::new()
                    .name(format!("agl-team-{i}"))
                    .spawn(move || helper(&shared))
                    .inspect_err(|e| tracing::warn!("decode loops get fewer threads: {e}"))
                    .ok()
            })
            .collect();
        Self { shared, helpers }
    }

    /// One loop of `tasks` (`1..=MAX_TASKS`).
    fn run(&self, tasks: usize, task: &(dyn Fn(usize) + Sync)) {
        let s = &self.shared;
        let job = Job { task };
        s.done.store(0, SeqCst);
        // The helpers see `job` only as the loop's `state` below allows, and
        // this returns only when no task of it is left running.
        s.job
            .store(&job as *const Job<'_> as *mut Job<'static>, SeqCst);
        let number = (s.state.load(SeqCst) >> (2 * TASK_BITS)) + 1;
        s.state.store(
            (number << (2 * TASK_BITS)) | ((tasks as u64) << TASK_BITS),
            SeqCst,
        );
        if s.sleepers.load(SeqCst) > 0 {
            let _guard = s.lock.lock().unwrap_or_else(PoisonError::into_inner);
            s.wake.notify_all();
        }
        loop {
            let state = s.state.load(SeqCst);
            if next_of(state) >= tasks {
                break;
            }
            s.take(state); // false when a helper took that task first
        }
        let mut spins = 0u32;
        while s.done.load(SeqCst) < tasks {
            spins += 1;
            if spins < 1 << 14 {
                std::hint::spin_loop();
            } else {
                // A helper was descheduled mid-task: let it have the core.
                std::thread::yield_now();
            }
        }
        if s.panicked.swap(false, SeqCst) {
            panic!("a task of a decode loop panicked");
        }
    }
}

/// A helper's life: take tasks while loops come, poll for [`SPIN`] when
/// none does, then sleep until one is announced.
fn helper(s: &Shared) {
    INSIDE.set(true);
    let mut idle_since: Option<Instant> = None;
    let mut polls = 0u32;
    while !s.stop.load(SeqCst) {
        let state = s.state.load(SeqCst);
        if s.take(state) {
            idle_since = None;
            continue;
        }
        std::hint::spin_loop();
        polls = polls.wrapping_add(1);
        if !polls.is_multiple_of(64) {
            continue;
        }
        let since = *idle_since.get_or_insert_with(Instant::now);
        if since.elapsed() < SPIN {
            continue;
        }
        let mut guard = s.lock.lock().unwrap_or_else(PoisonError::into_inner);
        s.sleepers.fetch_add(1, SeqCst);
        // A loop announced after `state` was read either is seen here or
        // sees this sleeper and notifies under the lock.
        while s.state.load(SeqCst) == state && !s.stop.load(SeqCst) {
            guard = s.wake.wait(guard).unwrap_or_else(PoisonError::into_inner);
        }
        s.sleepers.fetch_sub(1, SeqCst);
        idle_since = None;
    }
}

impl Drop for Team {
    fn drop(&mut self) {
        self.shared.stop.store(true, SeqCst);
        {
            let _guard = self
                .shared
                .lock
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            self.shared.wake.notify_all();
        }
        for helper in self.helpers.drain(..) {
            let _ = helper.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    #[test]
    fn every_task_runs_once_per_loop() {
        let team = Team::new(3);
        for tasks in [2, 7, 64, MAX_TASKS] {
            let counts: Vec<AtomicU32> = (0..tasks).map(|_| AtomicU32::new(0)).collect();
            for _ in 0..50 {
                team.run(tasks, &|i| {
                    counts[i].fetch_add(1, SeqCst);
                });
            }
            assert!(counts.iter().all(|c| c.load(SeqCst) == 50), "{tasks} tasks");
        }
    }

    #[test]
    fn more_tasks_than_a_round_and_helpers_that_slept() {
        let hits: Vec<AtomicU32> = (0..MAX_TASKS * 2 + 5).map(|_| AtomicU32::new(0)).collect();
        for_each(hits.len(), |i| {
            hits[i].fetch_add(1, SeqCst);
        });
        // Past the spin: the helpers sleep and the next loop wakes them.
        std::thread::sleep(SPIN * 3);
        for_each(hits.len(), |i| {
            hits[i].fetch_add(1, SeqCst);
        });
        assert!(hits.iter().all(|h| h.load(SeqCst) == 2));
    }

    #[test]
    fn helpers_take_tasks() {
        let team = Team::new(2);
        let helper_ran = AtomicBool::new(false);
        let caller = std::thread::current().id();
        // The caller's first task waits for a helper to run one (for 10 s at
        // most), so the test fails only if no helper takes a task.
        team.run(4, &|_| {
            if std::thread::current().id() != caller {
                helper_ran.store(true, SeqCst);
                return;
            }
            let start = Instant::now();
            while !helper_ran.load(SeqCst) && start.elapsed() < Duration::from_secs(10) {
                std::thread::yield_now();
            }
        });
        assert!(helper_ran.load(SeqCst));
    }

    #[test]
    fn chunks_cover_the_slice_once() {
        let mut data = vec![0usize; 103];
        for_each_chunk_mut(&mut data, 10, |i, piece| {
            assert_eq!(piece.len(), if i == 10 { 3 } else { 10 });
            for (j, x) in piece.iter_mut().enumerate() {
                *x += i * 10 + j;
            }
        });
        assert_eq!(data, (0..103).collect::<Vec<_>>());
    }

    #[test]
    fn a_nested_loop_runs_on_its_thread() {
        let sums: Vec<AtomicU32> = (0..8).map(|_| AtomicU32::new(0)).collect();
        for_each(8, |i| {
            assert_eq!(threads(), 1);
            for_each(4, |j| {
                sums[i].fetch_add(j as u32, SeqCst);
            });
        });
        assert!(sums.iter().all(|s| s.load(SeqCst) == 6));
    }

    #[test]
    fn a_panicking_task_panics_the_caller_after_the_others() {
        let finished = AtomicU32::new(0);
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            for_each(32, |i| {
                if i == 5 {
                    panic!("task 5");
                }
                finished.fetch_add(1, SeqCst);
            })
        }));
        assert!(outcome.is_err());
        assert_eq!(finished.load(SeqCst), 31);
        // The team still runs loops.
        let after = AtomicU32::new(0);
        for_each(10, |_| {
            after.fetch_add(1, SeqCst);
        });
        assert_eq!(after.load(SeqCst), 10);
    }
}

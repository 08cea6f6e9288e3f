//! The collocated-async group scheduler and the simulation that drives it.

use std::collections::HashMap;

use crate::schedule_sim::{CallDrain, SimConfig, simulate};
use agl_rl::{GroupScheduler, ScheduleConfig, ScheduleError, Update};

fn cfg(in_flight: usize, per_update: usize, max_staleness: Option<u64>) -> ScheduleConfig {
    ScheduleConfig {
        groups_in_flight: in_flight,
        groups_per_update: per_update,
        max_staleness,
    }
}

/// Launches up to the quota, keys `g{first}..`; returns the keys.
fn launch(s: &mut GroupScheduler<u32>, first: &mut usize, version: u64) -> Vec<String> {
    let mut keys = Vec::new();
    for _ in 0..s.launch_quota() {
        let key = format!("g{first}");
        *first += 1;
        s.launched(key.clone(), version).unwrap();
        keys.push(key);
    }
    keys
}

fn keys<G>(update: &Update<G>) -> Vec<&str> {
    update.groups.iter().map(|(k, _, _)| k.as_str()).collect()
}

#[test]
fn config_validation() {
    assert!(cfg(8, 8, None).validate().is_ok());
    assert!(cfg(12, 8, Some(2)).validate().is_ok());
    assert!(cfg(4, 8, None).validate().is_err());
    assert!(cfg(4, 0, None).validate().is_err());
    assert!(matches!(
        GroupScheduler::<u32>::new(cfg(2, 3, None)),
        Err(ScheduleError::Config(_))
    ));
    let sync = ScheduleConfig::sync(5);
    assert_eq!((sync.groups_in_flight, sync.groups_per_update), (5, 5));
}

#[test]
fn sync_never_launches_while_waiting_or_training_and_returns_all() {
    let mut s = GroupScheduler::new(ScheduleConfig::sync(3)).unwrap();
    let mut next = 0;
    for version in 0..3u64 {
        let launched = launch(&mut s, &mut next, version);
        assert_eq!(launched.len(), 3);
        assert_eq!(s.launch_quota(), 0);
        for (i, key) in launched.iter().rev().enumerate() {
            assert!(s.next_update(version).is_none(), "update before all done");
            s.completed(key, i as u32).unwrap();
            assert_eq!(s.launch_quota(), 0, "launch during the wait");
        }
        let update = s.next_update(version).unwrap();
        assert_eq!(update.groups.len(), 3);
        assert!(update.dropped_stale.is_empty());
        assert!(update.groups.iter().all(|(_, v, _)| *v == version));
        // Training: the batch still holds the slots.
        assert_eq!(s.launch_quota(), 0);
        assert_eq!((s.in_flight(), s.waiting()), (0, 0));
        s.finish_update().unwrap();
        assert_eq!(s.launch_quota(), 3);
    }
    assert_eq!(s.finish_update(), Err(ScheduleError::NoPendingUpdate));
}

#[test]
fn async_quota_refills_and_counts_waiting_groups() {
    let mut s = GroupScheduler::new(cfg(5, 2, None)).unwrap();
    let mut next = 0;
    assert_eq!(launch(&mut s, &mut next, 0).len(), 5);
    assert!(matches!(
        s.launched("extra".into(), 0),
        Err(ScheduleError::NoQuota(5))
    ));
    // Complete groups still hold their slot until trained.
    s.completed("g1", 1).unwrap();
    assert_eq!((s.in_flight(), s.waiting(), s.launch_quota()), (4, 1, 0));
    s.completed("g3", 3).unwrap();
    s.completed("g0", 0).unwrap();
    let update = s.next_update(0).unwrap();
    assert_eq!(keys(&update), ["g1", "g3"]);
    assert_eq!(s.launch_quota(), 0, "the batch in training holds its slots");
    s.finish_update().unwrap();
    // g0 waits, g2 and g4 run: 2 free slots.
    assert_eq!((s.in_flight(), s.waiting(), s.launch_quota()), (2, 1, 2));
    assert_eq!(launch(&mut s, &mut next, 1), ["g5", "g6"]);
    assert_eq!(s.launch_quota(), 0);
}

#[test]
fn updates_follow_completion_order_with_launch_order_on_ties() {
    let mut s = GroupScheduler::new(cfg(6, 3, None)).unwrap();
    let mut next = 0;
    launch(&mut s, &mut next, 0);
    s.completed("g4", 40).unwrap();
    // g2, g0 and g5 finish at the same moment: launch order decides.
    s.completed_together(vec![("g5".into(), 50), ("g2".into(), 20), ("g0".into(), 0)])
        .unwrap();
    let update = s.next_update(0).unwrap();
    assert_eq!(keys(&update), ["g4", "g0", "g2"]);
    assert_eq!(
        update.groups.iter().map(|g| g.2).collect::<Vec<_>>(),
        [40, 0, 20]
    );
    assert_eq!(s.waiting(), 1, "g5 is carried");
}

#[test]
fn completed_together_is_all_or_nothing() {
    let mut s = GroupScheduler::new(cfg(3, 1, None)).unwrap();
    let mut next = 0;
    launch(&mut s, &mut next, 0);
    let err = s.completed_together(vec![("g0".into(), 0), ("nope".into(), 1)]);
    assert_eq!(err, Err(ScheduleError::UnknownGroup("nope".into())));
    let dup = s.completed_together(vec![("g0".into(), 0), ("g0".into(), 1)]);
    assert!(dup.is_err());
    assert_eq!((s.in_flight(), s.waiting()), (3, 0));
}

#[test]
fn unknown_and_duplicate_keys_are_errors() {
    let mut s = GroupScheduler::new(cfg(3, 1, None)).unwrap();
    s.launched("a".into(), 0).unwrap();
    assert_eq!(
        s.completed("b", 1),
        Err(ScheduleError::UnknownGroup("b".into()))
    );
    assert_eq!(
        s.launched("a".into(), 0),
        Err(ScheduleError::DuplicateGroup("a".into()))
    );
    s.completed("a", 1).unwrap();
    // Completed once: a second completion is unknown, a relaunch a duplicate.
    assert_eq!(
        s.completed("a", 2),
        Err(ScheduleError::UnknownGroup("a".into()))
    );
    assert!(s.launched("a".into(), 0).is_err());
    assert_eq!(s.waiting(), 1);
}

#[test]
fn stale_groups_are_dropped_not_trained() {
    let mut s = GroupScheduler::new(cfg(4, 2, Some(1))).unwrap();
    s.launched("old".into(), 0).unwrap();
    s.launched("mid".into(), 1).unwrap();
    s.launched("new1".into(), 2).unwrap();
    s.launched("new2".into(), 2).unwrap();
    for (i, key) in ["old", "mid", "new1"].iter().enumerate() {
        s.completed(key, i as u32).unwrap();
    }
    // At version 2 only "old" (staleness 2) is stale: 2 fresh groups.
    // Not enough fresh groups at version 3 ("mid" is stale too): None, and
    // nothing is removed.
    assert!(s.next_update(3).is_none());
    assert_eq!(s.waiting(), 3);
    let update = s.next_update(2).unwrap();
    assert_eq!(keys(&update), ["mid", "new1"]);
    assert_eq!(
        update.dropped_stale,
        vec![("old".to_string(), 0)],
        "stale group returned, not trained"
    );
    assert_eq!(
        update.groups.iter().map(|g| g.1).collect::<Vec<_>>(),
        [1, 2]
    );
    assert_eq!(s.waiting(), 0);
}

#[test]
fn take_stale_frees_slots_without_an_update() {
    let mut s = GroupScheduler::new(cfg(3, 2, Some(0))).unwrap();
    s.launched("a".into(), 0).unwrap();
    s.launched("b".into(), 1).unwrap();
    s.launched("c".into(), 1).unwrap();
    s.completed("a", 0).unwrap();
    s.completed("b", 1).unwrap();
    assert_eq!(s.launch_quota(), 0);
    assert!(s.take_stale(0).is_empty());
    assert_eq!(s.take_stale(1), vec![("a".to_string(), 0)]);
    assert_eq!((s.waiting(), s.launch_quota()), (1, 1));
    // Unbounded staleness never drops.
    let mut u = GroupScheduler::new(cfg(1, 1, None)).unwrap();
    u.launched("x".into(), 0).unwrap();
    u.completed("x", 0).unwrap();
    assert!(u.take_stale(1000).is_empty());
    assert_eq!(u.next_update(1000).unwrap().groups[0].1, 0);
}

#[test]
fn stale_in_flight_groups_can_be_cancelled() {
    let mut s = GroupScheduler::new(cfg(3, 1, Some(1))).unwrap();
    s.launched("v0a".into(), 0).unwrap();
    s.launched("v1".into(), 1).unwrap();
    s.launched("v0b".into(), 0).unwrap();
    assert!(s.cancel_stale_in_flight(1).is_empty());
    assert_eq!(s.cancel_stale_in_flight(2), ["v0a", "v0b"]);
    assert_eq!((s.in_flight(), s.launch_quota()), (1, 2));
    assert!(matches!(
        s.completed("v0a", 0),
        Err(ScheduleError::UnknownGroup(_))
    ));
}

#[test]
fn carried_groups_survive_to_the_next_update() {
    let mut s = GroupScheduler::new(cfg(6, 2, Some(2))).unwrap();
    let mut next = 0;
    launch(&mut s, &mut next, 0);
    for key in ["g0", "g1", "g2", "g3"] {
        s.completed(key, 0).unwrap();
    }
    assert_eq!(keys(&s.next_update(0).unwrap()), ["g0", "g1"]);
    s.finish_update().unwrap();
    launch(&mut s, &mut next, 1);
    s.completed("g6", 0).unwrap();
    let update = s.next_update(1).unwrap();
    assert_eq!(keys(&update), ["g2", "g3"]);
    assert_eq!(
        update.groups.iter().map(|g| g.1).collect::<Vec<_>>(),
        [0, 0]
    );
    assert_eq!(s.waiting(), 1);
}

#[test]
fn snapshot_and_restore_rebuild_the_state() {
    let mut s = GroupScheduler::new(cfg(4, 2, Some(3))).unwrap();
    let mut next = 0;
    launch(&mut s, &mut next, 5);
    s.completed("g2", 22).unwrap();
    s.completed("g0", 0).unwrap();
    s.completed("g1", 11).unwrap();
    let _update = s.next_update(6).unwrap();
    assert_eq!(s.snapshot(), Err(ScheduleError::UpdatePending(1)));
    s.finish_update().unwrap();
    let snap = s.snapshot().unwrap();
    assert_eq!(snap.in_flight, vec![("g3".to_string(), 5)]);
    assert_eq!(snap.waiting, vec![("g1".to_string(), 5)]);
    let json = serde_json::to_string(&snap).unwrap();
    let snap = serde_json::from_str(&json).unwrap();

    let missing = GroupScheduler::<u32>::restore(cfg(4, 2, Some(3)), &snap, HashMap::new());
    assert!(matches!(missing, Err(ScheduleError::MissingPayload(k)) if k == "g1"));
    let payloads = HashMap::from([("g1".to_string(), 11)]);
    let mut r = GroupScheduler::restore(cfg(4, 2, Some(3)), &snap, payloads).unwrap();
    assert_eq!((r.in_flight(), r.waiting(), r.launch_quota()), (1, 1, 2));
    r.completed("g3", 33).unwrap();
    let update = r.next_update(7).unwrap();
    assert_eq!(
        update.groups,
        vec![("g1".to_string(), 5, 11), ("g3".to_string(), 5, 33)]
    );
}

fn sim(in_flight: usize, per_update: usize, sigma: f64) -> SimConfig {
    SimConfig {
        schedule: cfg(in_flight, per_update, None),
        group_size: 3,
        updates: 4,
        rollout_median_secs: 10.0,
        rollout_sigma: sigma,
        train_step_secs: 2.0,
        update_pause_secs: 1.5,
        max_concurrent_rollouts: None,
        cancel_stale_in_flight: false,
        drain: None,
        seed: 7,
    }
}

#[test]
fn sim_a_drain_waits_for_calls_and_partial_rollouts_do_not() {
    let drain = Some(CallDrain {
        call_median_secs: 2.0,
        call_sigma: 1.0,
    });
    // Sync: nothing runs at an update, so a drain costs nothing.
    let plain = simulate(&sim(2, 2, 0.0)).unwrap();
    let drained = simulate(&SimConfig {
        drain,
        ..sim(2, 2, 0.0)
    })
    .unwrap();
    assert_eq!(
        (drained.wall_secs, drained.drain_secs),
        (plain.wall_secs, 0.0)
    );
    // Async: rollouts run through every update.
    let partial = simulate(&sim(6, 2, 1.0)).unwrap();
    let drained = simulate(&SimConfig {
        drain,
        ..sim(6, 2, 1.0)
    })
    .unwrap();
    assert_eq!(partial.drain_secs, 0.0);
    assert!(drained.drain_secs > 0.0, "{drained:?}");
    assert!(
        drained.wall_secs > partial.wall_secs,
        "{drained:?} vs {partial:?}"
    );
    // Without a drain the engine idles exactly for the loads.
    let loads = partial.updates as f64 * 1.5;
    assert!((partial.engine_idle_fraction - loads / partial.wall_secs).abs() < 1e-9);
    assert!(drained.engine_idle_fraction > loads / drained.wall_secs);
    let bad = SimConfig {
        drain: Some(CallDrain {
            call_median_secs: 0.0,
            call_sigma: 1.0,
        }),
        ..sim(2, 2, 1.0)
    };
    assert!(matches!(simulate(&bad), Err(ScheduleError::Config(_))));
}

#[test]
fn sim_sync_with_identical_durations_matches_the_formula() {
    // Each update: every rollout takes D, then train T, then pause P.
    let r = simulate(&sim(2, 2, 0.0)).unwrap();
    assert!(
        (r.wall_secs - 4.0 * (10.0 + 2.0 + 1.5)).abs() < 1e-9,
        "{r:?}"
    );
    assert_eq!((r.updates, r.max_staleness, r.dropped_groups), (4, 0, 0));
    assert!((r.trainer_idle_fraction - 10.0 / 13.5).abs() < 1e-9);
    assert_eq!(r.launched_groups, 8);
    // 6 rollouts per update with 4 slots: two waves of D.
    let capped = SimConfig {
        max_concurrent_rollouts: Some(4),
        ..sim(2, 2, 0.0)
    };
    let r = simulate(&capped).unwrap();
    assert!(
        (r.wall_secs - 4.0 * (20.0 + 2.0 + 1.5)).abs() < 1e-9,
        "{r:?}"
    );
}

#[test]
fn sim_async_with_identical_durations_matches_a_hand_trace() {
    // B_async 4, B_train 2, D 10, T 2, P 1.5, rollouts frozen in pauses:
    // t=10 all 4 done, U1 (staleness 0) to 13.5, launch C (v1);
    // U2 on the carried pair (staleness 1) to 17, launch D (v2);
    // C is frozen in U2's pause: done at 13.5 + 10 + 1.5 = 25;
    // U3 (staleness 1) trains 25..27, pause to 28.5; D ran 17..27, done;
    // U4 (staleness 1) trains 28.5..30.5, pause to 32.
    let r = simulate(&sim(4, 2, 0.0)).unwrap();
    assert!((r.wall_secs - 32.0).abs() < 1e-9, "{r:?}");
    assert!((r.mean_staleness - 0.75).abs() < 1e-12);
    assert_eq!(r.max_staleness, 1);
    // Idle: 0..10 and 17..25.
    assert!(
        (r.trainer_idle_fraction - 18.0 / 32.0).abs() < 1e-9,
        "{r:?}"
    );
}

#[test]
fn sim_async_beats_sync_on_heavy_tails() {
    let sync = simulate(&sim(2, 2, 1.5)).unwrap();
    let r#async = simulate(&sim(6, 2, 1.5)).unwrap();
    assert!(
        r#async.wall_secs < sync.wall_secs,
        "async {async:?} vs sync {sync:?}"
    );
    assert!(r#async.mean_staleness > 0.0);
    // Same seed, same durations: the simulation is deterministic.
    assert_eq!(simulate(&sim(6, 2, 1.5)).unwrap(), r#async);
}

#[test]
fn sim_respects_the_staleness_bound() {
    for cancel in [false, true] {
        let bounded = SimConfig {
            schedule: cfg(8, 2, Some(1)),
            updates: 30,
            cancel_stale_in_flight: cancel,
            ..sim(8, 2, 1.5)
        };
        let r = simulate(&bounded).unwrap();
        assert!(r.max_staleness <= 1, "{r:?}");
        assert!(r.dropped_groups + r.cancelled_groups > 0, "{r:?}");
        if !cancel {
            assert_eq!(r.cancelled_groups, 0);
        }
        let unbounded = simulate(&SimConfig {
            schedule: cfg(8, 2, None),
            ..bounded
        })
        .unwrap();
        assert!(unbounded.max_staleness > 1, "{unbounded:?}");
        assert_eq!(unbounded.dropped_groups + unbounded.cancelled_groups, 0);
    }
}

#[test]
fn sim_rejects_bad_configs() {
    let bad = [
        SimConfig {
            group_size: 0,
            ..sim(2, 2, 1.0)
        },
        SimConfig {
            rollout_median_secs: 0.0,
            ..sim(2, 2, 1.0)
        },
        SimConfig {
            max_concurrent_rollouts: Some(0),
            ..sim(2, 2, 1.0)
        },
        sim(1, 2, 1.0),
    ];
    for cfg in bad {
        assert!(matches!(simulate(&cfg), Err(ScheduleError::Config(_))));
    }
}

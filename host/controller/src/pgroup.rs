//! Process groups: each local agent leads its own group, so signalling the
//! group reaches everything it spawned.

use std::time::Duration;

/// Sends `sig` to process group `pgid`; false when the group is gone.
pub fn signal_group(pgid: u32, sig: i32) -> bool {
    let Ok(pgid) = libc::pid_t::try_from(pgid) else {
        return false;
    };
    if pgid <= 1 {
        return false; // never the caller's own group or every process
    }
    // SAFETY: killpg takes plain integers and has no memory effects.
    unsafe { libc::killpg(pgid, sig) == 0 }
}

/// Whether any process of the group is still there.
pub fn group_alive(pgid: u32) -> bool {
    signal_group(pgid, 0)
}

/// SIGTERM to the group, then SIGKILL after `grace` if any member is left.
pub async fn terminate_group(pgid: u32, grace: Duration) {
    if !signal_group(pgid, libc::SIGTERM) {
        return;
    }
    let deadline = tokio::time::Instant::now() + grace;
    while tokio::time::Instant::now() < deadline {
        if !group_alive(pgid) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    signal_group(pgid, libc::SIGKILL);
}

/// The start time of `pid` (clock ticks since boot, `/proc/<pid>/stat` field
/// 22); with the pid it identifies a process across pid reuse.
pub fn start_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: fields
    // after it start past the last ')'. Field 3 is the first there.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(22 - 3)?.parse().ok()
}

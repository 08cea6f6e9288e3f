//! `release_freed_memory`: freed blocks leave the resident set. glibc's
//! setting is process-wide, so each case runs in a child process (this
//! binary, the ignored `probe` test).

use std::process::Command;

fn rss_kb() -> i64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Allocates, touches and frees `mb` MiB; returns how much of it stayed
/// resident (KiB).
fn retained_kb(mb: usize) -> i64 {
    let before = rss_kb();
    let block: Vec<u8> = std::hint::black_box(vec![1u8; mb << 20]);
    drop(block);
    rss_kb() - before
}

/// Run by [`freed_blocks_go_back_to_the_system`] with `AGL_MEMORY_PROBE`
/// set: prints what a 4 MiB block left resident after a 24 MiB one was
/// freed (which raises glibc's dynamic mmap threshold).
#[test]
#[ignore = "a child process of freed_blocks_go_back_to_the_system"]
fn probe() {
    let Ok(mode) = std::env::var("AGL_MEMORY_PROBE") else {
        return;
    };
    if mode == "release" {
        assert!(agl_trainer::memory::release_freed_memory());
    }
    retained_kb(24);
    println!("retained_kb {}", retained_kb(4));
}

fn probe_in_child(mode: &str) -> i64 {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["memory::probe", "--exact", "--ignored", "--nocapture"])
        .args(["--test-threads", "1"])
        .env("AGL_MEMORY_PROBE", mode)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    text.lines()
        .find_map(|l| l.split("retained_kb ").nth(1))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no figure in {text}"))
}

#[test]
fn freed_blocks_go_back_to_the_system() {
    let kept = probe_in_child("default");
    let released = probe_in_child("release");
    // glibc's default keeps the 4 MiB block in its heap; with the setting
    // it had pages of its own, unmapped when freed.
    assert!(kept > 3 * 1024, "default heap kept {kept} KiB");
    assert!(released < 1024, "released heap kept {released} KiB");
}

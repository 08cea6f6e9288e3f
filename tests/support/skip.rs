//! A test that cannot run here (a CPU feature, a package, a device) says so
//! instead of passing: libtest has no runtime skip, so [`skip`] records the
//! test's name and reason, and `tests/run.sh` counts it as skipped, not
//! passed, and prints it by name. Included with `#[path]` by every test
//! binary that skips (one definition of the record's format).
//!
//! The record: one line `NAME<TAB>REASON` appended to the file named by
//! `$AGL_SKIPS` (when set; always echoed to stderr).

use std::io::Write;

/// Records the running test as skipped because of `why`. The caller then
/// returns: what follows did not run.
#[track_caller]
pub fn skip(why: &str) {
    // libtest names each test's thread after the test's path; a test run
    // on the main thread (`--test-threads=1` in some versions) falls back
    // to the caller's location.
    let thread = std::thread::current();
    let name = match thread.name() {
        Some(name) if name != "main" => name.to_owned(),
        _ => std::panic::Location::caller().to_string(),
    };
    let name = format!("{}::{name}", env!("CARGO_CRATE_NAME"));
    let why = why.replace(['\t', '\n'], " ");
    eprintln!("SKIPPED {name}: {why}");
    if let Some(path) = std::env::var_os("AGL_SKIPS") {
        let line = format!("{name}\t{why}\n");
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(line.as_bytes()));
        // A skip that cannot be recorded must not pass silently.
        if let Err(e) = written {
            panic!("{name} skipped ({why}), but recording it failed: {e}");
        }
    }
}

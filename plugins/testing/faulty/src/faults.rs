//! World-independent misbehaviour.

use std::hint::black_box;

/// The fault to act out: the rollout input's `fault` key if it has one (so
/// one loaded plugin can misbehave on one call and behave on the next), else
/// the config's, else `none`.
pub fn choose(input_json: &str, config_json: &str) -> Result<String, String> {
    if let Some(fault) = fault_in(input_json)? {
        return Ok(fault);
    }
    Ok(fault_in(config_json)?.unwrap_or_else(|| "none".to_string()))
}

fn fault_in(json: &str) -> Result<Option<String>, String> {
    let value: serde_json::Value =
        serde_json::from_str(json).map_err(|e| format!("not JSON: {e}: {json}"))?;
    match value.get("fault") {
        None => Ok(None),
        Some(serde_json::Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(format!("fault must be a string, got {other}")),
    }
}

/// Runs forever; only the host's deadline stops it.
pub fn spin() -> ! {
    let mut n: u64 = 0;
    loop {
        n = black_box(n.wrapping_add(1));
    }
}

/// Allocates (and touches) 1 MiB blocks until the host refuses more memory.
pub fn exhaust_memory() -> ! {
    let mut blocks: Vec<Vec<u8>> = Vec::new();
    loop {
        blocks.push(vec![1u8; 1 << 20]);
        black_box(&blocks);
    }
}

pub fn deliberate_panic() -> ! {
    panic!("faulty plugin: deliberate panic");
}

/// Recursion that exhausts the wasm call stack (a stack-overflow trap).
/// `limit` comes from the input, so the compiler cannot prove that the
/// recursion never ends and turn it into a loop.
pub fn overflow_stack(depth: u64, limit: u64) -> u64 {
    if depth == limit {
        return 0;
    }
    overflow_stack(depth + 1, limit).rotate_left((depth & 63) as u32)
}

/// Recursion with frames in linear memory, which overflows Rust's shadow
/// stack and ends in an out-of-bounds memory access.
#[allow(unconditional_recursion)] // the point of the `shadow-stack` fault
pub fn overflow_shadow_stack(depth: u64) -> u64 {
    let frame = black_box([depth; 32]);
    overflow_shadow_stack(black_box(depth + 1)).wrapping_add(frame[7])
}

/// `Err` describing the denial when the sandbox blocks file access; `Ok` with
/// what leaked when it does not.
pub fn probe_fs() -> Result<String, String> {
    let read = std::fs::read("/etc/passwd");
    let write = std::fs::write("agl-faulty-probe.txt", b"probe");
    match (read, write) {
        (Err(r), Err(w)) => Err(format!("fs denied: read /etc/passwd: {r}; write: {w}")),
        (read, write) => Ok(format!(
            "fs leaked: read={:?} write={:?}",
            read.map(|bytes| bytes.len()),
            write
        )),
    }
}

/// Connects to the input's `target` (the host test's listening socket;
/// default 127.0.0.1:1): `Err` when denied, `Ok` with the peer when it
/// got through.
pub fn probe_net(input_json: &str) -> Result<String, String> {
    let target = serde_json::from_str::<serde_json::Value>(input_json)
        .ok()
        .and_then(|v| v.get("target")?.as_str().map(str::to_owned))
        .unwrap_or_else(|| "127.0.0.1:1".to_owned());
    match std::net::TcpStream::connect(target.as_str()) {
        Err(e) => Err(format!("net denied: connect {target}: {e}")),
        Ok(stream) => Ok(format!("net leaked: connected {:?}", stream.peer_addr())),
    }
}

/// Always `Err`: the environment the guest can see (empty in the sandbox).
pub fn env_listing() -> String {
    let vars: Vec<String> = std::env::vars().map(|(k, v)| format!("{k}={v}")).collect();
    let args: Vec<String> = std::env::args().collect();
    format!("env vars: {vars:?}; args: {args:?}")
}

/// Always `Err`: what the guest's clocks read (frozen in the sandbox).
pub fn clock_reading() -> String {
    let wall = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|since| since.as_nanos());
    let start = std::time::Instant::now();
    let elapsed = start.elapsed();
    format!("wall={wall:?} monotonic_elapsed={elapsed:?}")
}

//! The WASI context a plugin runs in: no files, network, environment,
//! arguments or real clock; deterministic randomness; captured stderr.

use std::time::Duration;

use wasmtime_wasi::p2::pipe::SinkOutputStream;
use wasmtime_wasi::{Deterministic, HostMonotonicClock, HostWallClock, WasiCtx, WasiCtxBuilder};

use super::stdio::TailPipe;

/// Bytes of guest stderr kept for error messages (the tail of one call).
pub(crate) const STDERR_TAIL: usize = 64 * 1024;

/// A WASI context granting nothing beyond what std needs to start.
/// `stderr` receives the guest's stderr; stdout is discarded.
pub(crate) fn wasi_ctx(stderr: &TailPipe) -> WasiCtx {
    let mut builder = WasiCtxBuilder::new();
    // The builder's defaults already give closed stdin, discarded stdout, no
    // env, args or preopens; the rest is spelled out so that it stays so.
    builder
        .stderr(stderr.clone())
        .stdout(SinkOutputStream)
        .allow_tcp(false)
        .allow_udp(false)
        .allow_ip_name_lookup(false)
        .socket_addr_check(|_, _| Box::pin(async { false }))
        // The WIT grants no clock: time must not leak into samples.
        .wall_clock(FrozenClock)
        .monotonic_clock(FrozenClock)
        // std seeds HashMap keys from here; fixed bytes keep runs reproducible.
        .secure_random(Deterministic::new(SEED.to_vec()))
        .insecure_random(Deterministic::new(SEED.to_vec()))
        .insecure_random_seed(0);
    builder.build()
}

const SEED: [u8; 8] = *b"agl-seed";

/// A clock stuck at the Unix epoch.
struct FrozenClock;

impl HostWallClock for FrozenClock {
    fn resolution(&self) -> Duration {
        Duration::from_nanos(1)
    }

    fn now(&self) -> Duration {
        Duration::ZERO
    }
}

impl HostMonotonicClock for FrozenClock {
    fn resolution(&self) -> u64 {
        1
    }

    fn now(&self) -> u64 {
        0
    }
}

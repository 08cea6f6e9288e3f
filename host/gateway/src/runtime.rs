//! The async runtime of every `agl` subcommand that does I/O (`agl serve`
//! runs the gateway on it), and of the gateway's benchmarks (so they
//! measure what ships).

/// Multi-threaded, with tokio's own scheduling defaults. Checking the I/O
/// driver and the global queue every 8 task polls (instead of 61 and a
/// self-tuned interval) once cut the gateway bench's p50 at 64 connections,
/// when each proxied call crossed more hand-offs between tasks; since its
/// engine connection is driven by the call itself (`proxy/engine_conn.rs`),
/// the extra checks are mostly empty `epoll_wait`s: with the defaults the
/// bench's process makes ~0.70 of them per call instead of ~1.12 (perf
/// syscall counts, 64 connections, 2 cores), at the same throughput and
/// p50 within the host's noise.
pub fn build() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
}

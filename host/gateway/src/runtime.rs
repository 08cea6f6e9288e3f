//! The async runtime of every `agl` subcommand that does I/O (`agl serve`
//! runs the gateway on it), and of the gateway's benchmarks (so they
//! measure what ships).

/// Multi-threaded, checking the I/O driver and the global queue every 8 task
/// polls instead of tokio's 61 and 31. Under load a worker otherwise runs
/// dozens of ready tasks before it notices that a socket became readable or
/// that the store's writer thread finished a commit, and each proxied call
/// crosses several such hand-offs: in the gateway bench (64 connections,
/// 2 cores) this took the added p50 from ~1.8 ms to ~1.1 ms and p99 from
/// ~4.3 ms to ~2 ms, at no measurable CPU cost.
pub fn build() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .event_interval(8)
        .global_queue_interval(8)
        .build()
}

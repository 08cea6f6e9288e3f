//! Token bucket for Job creations: a burst of `per_minute` creations, then
//! one every `60 / per_minute` seconds. Keeps a flood of queued rollouts
//! from hammering the API server (and the cluster's scheduler).

use std::time::Duration;

use tokio::sync::Mutex;
use tokio::time::{Instant, sleep};

pub struct RateLimiter {
    per_second: f64,
    capacity: f64,
    bucket: Mutex<Bucket>,
}

struct Bucket {
    tokens: f64,
    refilled_at: Instant,
}

impl RateLimiter {
    /// `per_minute` must be at least 1 (checked by the runner's config).
    pub fn new(per_minute: u32) -> Self {
        let capacity = f64::from(per_minute);
        RateLimiter {
            per_second: capacity / 60.0,
            capacity,
            bucket: Mutex::new(Bucket {
                tokens: capacity,
                refilled_at: Instant::now(),
            }),
        }
    }

    /// Waits for a token and takes it. Waiters hold the lock while they
    /// sleep, so they are served in arrival order (tokio's mutex is fair).
    pub async fn acquire(&self) {
        let mut bucket = self.bucket.lock().await;
        loop {
            let now = Instant::now();
            let elapsed = now.duration_since(bucket.refilled_at).as_secs_f64();
            bucket.tokens = (bucket.tokens + elapsed * self.per_second).min(self.capacity);
            bucket.refilled_at = now;
            if bucket.tokens >= 1.0 {
                bucket.tokens -= 1.0;
                return;
            }
            let missing = 1.0 - bucket.tokens;
            sleep(Duration::from_secs_f64(missing / self.per_second)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn burst_then_one_per_interval() {
        let limiter = RateLimiter::new(6); // burst 6, then one every 10 s
        let start = Instant::now();
        for _ in 0..6 {
            limiter.acquire().await;
        }
        assert_eq!(start.elapsed(), Duration::ZERO);
        limiter.acquire().await;
        assert_eq!(start.elapsed().as_secs(), 10);
        limiter.acquire().await;
        assert_eq!(start.elapsed().as_secs(), 20);
        // An idle minute refills the whole burst, and no more.
        sleep(Duration::from_secs(600)).await;
        let idle_end = Instant::now();
        for _ in 0..6 {
            limiter.acquire().await;
        }
        assert_eq!(idle_end.elapsed(), Duration::ZERO);
        limiter.acquire().await;
        assert_eq!(idle_end.elapsed().as_secs(), 10);
    }
}

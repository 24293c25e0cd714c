//! Benchmarks shared by `cargo bench` and `runbook bench`: each returns
//! measured figures; nothing here is typed in by hand.

pub mod admission;
pub mod baseline;
pub mod containment;
pub mod decision;
pub mod fairness;
pub mod fixtures;
pub mod hooks;
pub mod lookup;
pub mod memory;
pub mod metrics;
pub mod native;
pub mod operator;
pub mod peers;
pub mod reload;
pub mod sandbox;
pub mod scaleout;
pub mod scenario;
pub mod suite;

use std::time::{Duration, Instant};

/// Summary of repeated timings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Stats {
    pub samples: usize,
    pub median: Duration,
    pub p99: Duration,
    pub mean: Duration,
}

impl Stats {
    pub fn from_samples(mut samples: Vec<Duration>) -> Self {
        assert!(!samples.is_empty(), "no samples");
        samples.sort();
        let n = samples.len();
        let total: Duration = samples.iter().sum();
        Self {
            samples: n,
            median: samples[n / 2],
            p99: samples[((n * 99) / 100).min(n - 1)],
            mean: total / n as u32,
        }
    }
}

/// Time `f` `iters` times after `warmup` untimed calls.
pub fn measure<T>(warmup: usize, iters: usize, f: impl FnMut() -> T) -> Stats {
    Stats::from_samples(samples(warmup, iters, f))
}

/// The timings of `iters` calls of `f` after `warmup` untimed calls.
pub fn samples<T>(warmup: usize, iters: usize, mut f: impl FnMut() -> T) -> Vec<Duration> {
    for _ in 0..warmup {
        std::hint::black_box(f());
    }
    let mut samples = Vec::with_capacity(iters);
    for _ in 0..iters {
        let start = Instant::now();
        std::hint::black_box(f());
        samples.push(start.elapsed());
    }
    samples
}

/// Timings taken in rounds, interleaved with other measurements, so that a
/// stretch of time in which the machine runs slow lands in a round or two
/// rather than in one measurement whole.
#[derive(Clone, Debug, Default)]
pub struct Rounds(Vec<Vec<Duration>>);

impl Rounds {
    pub fn push(&mut self, round: Vec<Duration>) {
        if !round.is_empty() {
            self.0.push(round);
        }
    }

    fn medians(&self) -> Vec<Duration> {
        let mut m: Vec<Duration> = self
            .0
            .iter()
            .map(|r| Stats::from_samples(r.clone()).median)
            .collect();
        m.sort();
        m
    }

    /// The median of the rounds' medians; p99 and mean over every sample.
    pub fn stats(&self) -> Stats {
        let all = Stats::from_samples(self.0.concat());
        let m = self.medians();
        Stats {
            median: m[m.len() / 2],
            ..all
        }
    }

    /// The lowest and the highest of the rounds' medians.
    pub fn spread(&self) -> (Duration, Duration) {
        let m = self.medians();
        (m[0], m[m.len() - 1])
    }
}

/// Time an async operation `iters` times after `warmup` untimed runs.
pub async fn measure_async<T, F, Fut>(warmup: usize, iters: usize, mut f: F) -> Stats
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = T>,
{
    for _ in 0..warmup {
        std::hint::black_box(f().await);
    }
    let mut samples = Vec::with_capacity(iters);
    for _ in 0..iters {
        let start = Instant::now();
        std::hint::black_box(f().await);
        samples.push(start.elapsed());
    }
    Stats::from_samples(samples)
}

/// Microseconds with two decimals.
pub fn us(d: Duration) -> f64 {
    (d.as_nanos() as f64 / 10.0).round() / 100.0
}

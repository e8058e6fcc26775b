//! The server's counters in Prometheus' text format (`GET /metrics`).

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Upper bounds (seconds) of the latency histograms' buckets.
const BUCKETS: [f64; 14] = [
    0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// A latency histogram: a count per bucket, the sum and the count.
#[derive(Debug, Default)]
struct Histogram {
    inner: Mutex<(Vec<u64>, f64, u64)>,
}

impl Histogram {
    fn observe(&self, seconds: f64) {
        let Ok(mut h) = self.inner.lock() else {
            return;
        };
        if h.0.is_empty() {
            h.0 = vec![0; BUCKETS.len()];
        }
        if let Some(i) = BUCKETS.iter().position(|&b| seconds <= b) {
            h.0[i] += 1;
        }
        h.1 += seconds;
        h.2 += 1;
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let (buckets, sum, count) = match self.inner.lock() {
            Ok(h) => (h.0.clone(), h.1, h.2),
            Err(_) => return,
        };
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cumulative = 0;
        for (i, b) in BUCKETS.iter().enumerate() {
            cumulative += buckets.get(i).copied().unwrap_or(0);
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {cumulative}");
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let _ = writeln!(out, "{name}_sum {sum}\n{name}_count {count}");
    }
}

/// What the worker and the routes count.
#[derive(Debug, Default)]
pub(crate) struct Metrics {
    pub running: AtomicU64,
    pub waiting: AtomicU64,
    pub prompt_tokens: AtomicU64,
    pub generated_tokens: AtomicU64,
    pub requests_ok: AtomicU64,
    pub requests_failed: AtomicU64,
    pub kv_blocks_used: AtomicU64,
    pub kv_blocks_total: AtomicU64,
    /// Prefix-cache hits, reused tokens and preemptions of engines before the current one
    /// (restarted after a failure), and of the current one.
    counts_before: Mutex<[u64; 3]>,
    counts_now: Mutex<[u64; 3]>,
    time_to_first_token: Histogram,
    inter_token: Histogram,
}

impl Metrics {
    /// The current engine's prefix-cache hits and reused tokens, and its preemptions (they
    /// start over with a new engine).
    pub fn engine_counts(&self, (hits, tokens): (u64, u64), preemptions: u64) {
        let (Ok(mut before), Ok(mut current)) = (self.counts_before.lock(), self.counts_now.lock())
        else {
            return;
        };
        let now = [hits, tokens, preemptions];
        if now.iter().zip(current.iter()).any(|(n, c)| n < c) {
            for (b, c) in before.iter_mut().zip(current.iter()) {
                *b += c;
            }
        }
        *current = now;
    }

    /// Prefix-cache hits, reused tokens and preemptions of every engine so far.
    fn engine_totals(&self) -> [u64; 3] {
        match (self.counts_before.lock(), self.counts_now.lock()) {
            (Ok(b), Ok(c)) => [b[0] + c[0], b[1] + c[1], b[2] + c[2]],
            _ => [0; 3],
        }
    }

    pub fn time_to_first_token(&self, seconds: f64) {
        self.time_to_first_token.observe(seconds);
    }

    pub fn inter_token(&self, seconds: f64) {
        self.inter_token.observe(seconds);
    }

    /// The Prometheus exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let gauge = |out: &mut String, name: &str, help: &str, v: &AtomicU64, kind: &str| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {}",
                v.load(Ordering::Relaxed)
            );
        };
        gauge(
            &mut out,
            "zoo_requests_running",
            "Sequences running in the engine.",
            &self.running,
            "gauge",
        );
        gauge(
            &mut out,
            "zoo_requests_waiting",
            "Sequences waiting for a row of the engine.",
            &self.waiting,
            "gauge",
        );
        gauge(
            &mut out,
            "zoo_prompt_tokens_total",
            "Prompt tokens admitted.",
            &self.prompt_tokens,
            "counter",
        );
        gauge(
            &mut out,
            "zoo_generated_tokens_total",
            "Tokens generated.",
            &self.generated_tokens,
            "counter",
        );
        let _ = writeln!(
            out,
            "# HELP zoo_requests_total Requests answered, by outcome.\n# TYPE zoo_requests_total counter\nzoo_requests_total{{outcome=\"ok\"}} {}\nzoo_requests_total{{outcome=\"error\"}} {}",
            self.requests_ok.load(Ordering::Relaxed),
            self.requests_failed.load(Ordering::Relaxed)
        );
        gauge(
            &mut out,
            "zoo_kv_blocks_used",
            "KV cache blocks held by running sequences (paged caches).",
            &self.kv_blocks_used,
            "gauge",
        );
        gauge(
            &mut out,
            "zoo_kv_blocks_total",
            "KV cache blocks in the pool (paged caches).",
            &self.kv_blocks_total,
            "gauge",
        );
        let [hits, tokens, preemptions] = self.engine_totals();
        let _ = writeln!(
            out,
            "# HELP zoo_prefix_cache_hits_total Sequences that reused a cached prompt prefix.\n# TYPE zoo_prefix_cache_hits_total counter\nzoo_prefix_cache_hits_total {hits}\n# HELP zoo_prefix_cache_tokens_total Prompt tokens taken from the prefix cache instead of computed.\n# TYPE zoo_prefix_cache_tokens_total counter\nzoo_prefix_cache_tokens_total {tokens}\n# HELP zoo_preemptions_total Sequences preempted for KV blocks (run again later).\n# TYPE zoo_preemptions_total counter\nzoo_preemptions_total {preemptions}"
        );
        self.time_to_first_token.render(
            &mut out,
            "zoo_time_to_first_token_seconds",
            "From a request's arrival to its first token.",
        );
        self.inter_token.render(
            &mut out,
            "zoo_inter_token_latency_seconds",
            "Between consecutive tokens of a sequence.",
        );
        out
    }
}

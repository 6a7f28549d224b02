//! Counters and histograms, written in Prometheus' text format.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

pub struct Histogram {
    bounds: &'static [f64],
    /// Per bucket (not cumulative) plus +Inf; then sum.
    counts: Mutex<(Vec<u64>, f64)>,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            counts: Mutex::new((vec![0; bounds.len() + 1], 0.0)),
        }
    }

    pub fn observe(&self, v: f64) {
        let i = self
            .bounds
            .iter()
            .position(|&b| v <= b)
            .unwrap_or(self.bounds.len());
        let mut c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        c.0[i] += 1;
        c.1 += v;
    }

    fn write(&self, out: &mut String, name: &str, help: &str) {
        let c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut acc = 0;
        for (b, n) in self.bounds.iter().zip(&c.0) {
            acc += n;
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {acc}");
        }
        acc += c.0[self.bounds.len()];
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {acc}");
        let _ = writeln!(out, "{name}_sum {}", c.1);
        let _ = writeln!(out, "{name}_count {acc}");
    }
}

pub struct Metrics {
    pub requests_chat: AtomicU64,
    pub requests_completions: AtomicU64,
    /// Requests answered with a 4xx/5xx.
    pub requests_failed: AtomicU64,
    pub requests_rejected_full: AtomicU64,
    pub prompt_tokens: AtomicU64,
    pub cached_prompt_tokens: AtomicU64,
    pub generated_tokens: AtomicU64,
    /// Speculative decoding: tokens drafted, and those the model kept.
    pub draft_tokens: AtomicU64,
    pub draft_tokens_accepted: AtomicU64,
    pub sequences_cancelled: AtomicU64,
    pub queue_depth: AtomicU64,
    pub active_sequences: AtomicU64,
    /// Token positions the active sequences hold in their KV caches.
    pub kv_positions: AtomicU64,
    /// Positions all sequence slots can hold: max sequences x context.
    pub kv_capacity: AtomicU64,
    pub open_connections: AtomicU64,
    /// Connections closed at accept: every open one had a request running.
    pub connections_refused: AtomicU64,
    pub ttft: Histogram,
    pub decode_rate: Histogram,
    /// Images run through the vision tower, and those whose rows were
    /// found already encoded (the engine's cache by pixels' hash).
    pub images_encoded: AtomicU64,
    pub images_reused: AtomicU64,
    /// Seconds each image's encoding took.
    pub image_encode: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            requests_chat: AtomicU64::new(0),
            requests_completions: AtomicU64::new(0),
            requests_failed: AtomicU64::new(0),
            requests_rejected_full: AtomicU64::new(0),
            prompt_tokens: AtomicU64::new(0),
            cached_prompt_tokens: AtomicU64::new(0),
            generated_tokens: AtomicU64::new(0),
            draft_tokens: AtomicU64::new(0),
            draft_tokens_accepted: AtomicU64::new(0),
            sequences_cancelled: AtomicU64::new(0),
            queue_depth: AtomicU64::new(0),
            active_sequences: AtomicU64::new(0),
            kv_positions: AtomicU64::new(0),
            kv_capacity: AtomicU64::new(0),
            open_connections: AtomicU64::new(0),
            connections_refused: AtomicU64::new(0),
            ttft: Histogram::new(&[0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0]),
            decode_rate: Histogram::new(&[1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0]),
            images_encoded: AtomicU64::new(0),
            images_reused: AtomicU64::new(0),
            image_encode: Histogram::new(&[0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0]),
        }
    }
}

impl Metrics {
    pub fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Relaxed);
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        fn one(out: &mut String, name: &str, help: &str, kind: &str, v: u64) {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}"
            );
        }
        let g = |c: &AtomicU64| c.load(Relaxed);
        let _ = writeln!(
            out,
            "# HELP onebit_requests_total Requests received, by endpoint.\n# TYPE onebit_requests_total counter\nonebit_requests_total{{endpoint=\"chat_completions\"}} {}\nonebit_requests_total{{endpoint=\"completions\"}} {}",
            g(&self.requests_chat),
            g(&self.requests_completions)
        );
        one(
            &mut out,
            "onebit_requests_failed_total",
            "Requests answered with an error status.",
            "counter",
            g(&self.requests_failed),
        );
        one(
            &mut out,
            "onebit_requests_rejected_total",
            "Requests refused because the queue was full.",
            "counter",
            g(&self.requests_rejected_full),
        );
        one(
            &mut out,
            "onebit_prompt_tokens_total",
            "Prompt tokens of admitted sequences.",
            "counter",
            g(&self.prompt_tokens),
        );
        one(
            &mut out,
            "onebit_prompt_tokens_cached_total",
            "Prompt tokens reused from the prefix cache.",
            "counter",
            g(&self.cached_prompt_tokens),
        );
        one(
            &mut out,
            "onebit_generated_tokens_total",
            "Tokens generated.",
            "counter",
            g(&self.generated_tokens),
        );
        one(
            &mut out,
            "onebit_draft_tokens_total",
            "Tokens drafted by speculative decoding.",
            "counter",
            g(&self.draft_tokens),
        );
        one(
            &mut out,
            "onebit_draft_tokens_accepted_total",
            "Drafted tokens the model agreed with.",
            "counter",
            g(&self.draft_tokens_accepted),
        );
        one(
            &mut out,
            "onebit_sequences_cancelled_total",
            "Sequences freed because the client went away or a stop string ended them.",
            "counter",
            g(&self.sequences_cancelled),
        );
        one(
            &mut out,
            "onebit_queue_depth",
            "Sequences waiting for a slot.",
            "gauge",
            g(&self.queue_depth),
        );
        one(
            &mut out,
            "onebit_active_sequences",
            "Sequences being prefilled or decoded.",
            "gauge",
            g(&self.active_sequences),
        );
        let ratio = |num: u64, den: u64| {
            if den == 0 {
                0.0
            } else {
                num as f64 / den as f64
            }
        };
        let _ = writeln!(
            out,
            "# HELP onebit_kv_cache_usage_ratio Token positions held by running sequences over what their slots hold (max sequences x context), 0 to 1.\n# TYPE onebit_kv_cache_usage_ratio gauge\nonebit_kv_cache_usage_ratio {}",
            ratio(g(&self.kv_positions), g(&self.kv_capacity))
        );
        let _ = writeln!(
            out,
            "# HELP onebit_prefix_cache_hit_ratio Prompt tokens reused from the prefix cache over all prompt tokens since start, 0 to 1.\n# TYPE onebit_prefix_cache_hit_ratio gauge\nonebit_prefix_cache_hit_ratio {}",
            ratio(g(&self.cached_prompt_tokens), g(&self.prompt_tokens))
        );
        one(
            &mut out,
            "onebit_open_connections",
            "HTTP connections open.",
            "gauge",
            g(&self.open_connections),
        );
        one(
            &mut out,
            "onebit_connections_refused_total",
            "Connections closed at once: at --max-connections, all busy.",
            "counter",
            g(&self.connections_refused),
        );
        self.ttft.write(
            &mut out,
            "onebit_time_to_first_token_seconds",
            "From admission to the queue to the first generated token.",
        );
        self.decode_rate.write(
            &mut out,
            "onebit_decode_tokens_per_second",
            "Per sequence: tokens after the first over the time since the first.",
        );
        one(
            &mut out,
            "onebit_images_encoded_total",
            "Images run through the vision tower.",
            "counter",
            g(&self.images_encoded),
        );
        one(
            &mut out,
            "onebit_images_reused_total",
            "Images whose rows were already encoded (same pixels), not run again.",
            "counter",
            g(&self.images_reused),
        );
        self.image_encode.write(
            &mut out,
            "onebit_image_encode_seconds",
            "Per image: the vision tower's encoding.",
        );
        out
    }
}

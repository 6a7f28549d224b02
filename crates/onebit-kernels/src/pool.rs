//! Work splitting across threads.
//!
//! Every op that is worth splitting calls `Pool::for_each_chunk`: the caller
//! says how many independent chunks there are and gets a callback per chunk.
//! The pool is the one place that knows how threads are started and parked, so
//! a persistent spinning pool can replace the scoped threads used here without
//! touching any kernel.

#[derive(Clone, Debug)]
pub struct Pool {
    threads: usize,
}

impl Pool {
    /// A pool of `threads` workers (the caller counts as one); 0 means all cores.
    pub fn new(threads: usize) -> Pool {
        let threads = if threads == 0 {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
        } else {
            threads
        };
        Pool { threads }
    }

    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Splits `0..n` into at most `threads` contiguous ranges and calls `f` on
    /// each, in parallel; each call returns a value, collected in range order.
    pub fn map_ranges<T: Send>(
        &self,
        n: usize,
        min_per_thread: usize,
        f: impl Fn(std::ops::Range<usize>) -> T + Sync,
    ) -> Vec<T> {
        let parts = self.threads.min(n / min_per_thread.max(1)).max(1);
        if parts == 1 {
            return vec![f(0..n)];
        }
        let bounds: Vec<usize> = (0..=parts).map(|i| i * n / parts).collect();
        std::thread::scope(|s| {
            let f = &f;
            let handles: Vec<_> = (1..parts)
                .map(|i| {
                    let r = bounds[i]..bounds[i + 1];
                    s.spawn(move || f(r))
                })
                .collect();
            let mut out = Vec::with_capacity(parts);
            out.push(f(bounds[0]..bounds[1]));
            for h in handles {
                out.push(h.join().expect("a worker thread panicked"));
            }
            out
        })
    }
}

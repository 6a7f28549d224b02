//! Work splitting across threads: a persistent pool of spinning workers.
//!
//! A `Pool` of `threads` has `threads - 1` worker threads started once; the
//! caller of an op is the remaining participant. An op is a number of chunks
//! and a borrowed closure; the caller publishes it (opens it), and every
//! participant, the caller included, claims chunks from an atomic counter
//! until none are left. The caller then waits for the chunks others claimed,
//! closes the op, and waits for any worker still inside it, so the borrowed
//! closure never outlives the call. A worker that the OS has descheduled (the
//! machine is shared) claims nothing and holds nobody up.
//!
//! Why spin: decode runs ~250 small matmuls per token. llama.cpp measured a
//! futex-only barrier cutting token generation from 39 to 14 t/s
//! (ggml-org/llama.cpp#13079). Idle workers spin for a budget
//! (`ONEBIT_SPIN_US`, default 1000 µs: longer than the gap between two ops of
//! a forward) and then park until the next op's `unpark`, so an idle server
//! does not burn its cores. Past the first 50 µs the spin yields the core on
//! every check: on an oversubscribed machine the worker may share a core with
//! its own caller, and a pure spin would then delay the next op it waits for.
//!
//! Two ways to split: [`Pool::map_ranges`] (contiguous ranges, at most one per
//! participant, results in order) and [`Pool::for_each_chunk`]. Which thread
//! computes what never changes a result: every kernel's output element is a
//! function of its inputs only.
//!
//! Re-entrant and concurrent calls (a job that calls the pool, two threads
//! sharing one pool) run on the calling thread alone rather than wait.

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{fence, AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// An output buffer that several of the pool's threads write disjoint
/// elements of (each chunk owns its own rows or tiles).
#[derive(Clone, Copy)]
pub(crate) struct OutPtr(pub(crate) *mut f32);
// SAFETY: a kernel only hands it to chunks that each write elements no
// other chunk reads or writes during the call, into a buffer that outlives
// the call; the pointer itself is plain data.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

/// An op as the workers see it: called with a chunk index.
type JobRef<'a> = &'a (dyn Fn(usize) + Sync + 'a);

/// Pads a value to its own cache line (two, against the adjacent-line prefetcher).
#[repr(align(128))]
struct Padded<T>(T);

/// How long an idle worker spins without yielding the core.
const PURE_SPIN: Duration = Duration::from_micros(50);

/// `open` value that tells workers to exit.
const SHUTDOWN: u64 = u64::MAX;

struct Shared {
    /// The id of the open op, 0 when none is open.
    open: Padded<AtomicU64>,
    /// Workers inside the current op (between entering and leaving it).
    active: Padded<AtomicUsize>,
    /// Next chunk to claim.
    next: Padded<AtomicUsize>,
    /// Chunks finished.
    done: Padded<AtomicUsize>,
    n_chunks: AtomicUsize,
    /// Points at a `JobRef` on the dispatching caller's stack while an op is open.
    job: AtomicPtr<JobRef<'static>>,
    panicked: AtomicBool,
    spin: Duration,
    /// Workers whose thread has started (counted once, before their loop).
    started: AtomicUsize,
}

struct Inner {
    threads: usize,
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    /// Held while an op runs (with the last op id); a caller that cannot take
    /// it runs alone.
    dispatch: Mutex<u64>,
}

/// A persistent thread pool; clones share the same workers.
#[derive(Clone)]
pub struct Pool {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("threads", &self.inner.threads)
            .finish()
    }
}

fn spin_budget() -> Duration {
    let us = std::env::var("ONEBIT_SPIN_US")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(1000);
    Duration::from_micros(us)
}

/// Claims and runs chunks of the current op until none are left.
fn claim_chunks(sh: &Shared, job: JobRef<'_>) {
    let n = sh.n_chunks.load(Ordering::Relaxed);
    loop {
        let c = sh.next.0.fetch_add(1, Ordering::Relaxed);
        if c >= n {
            return;
        }
        if catch_unwind(AssertUnwindSafe(|| job(c))).is_err() {
            sh.panicked.store(true, Ordering::Relaxed);
        }
        sh.done.0.fetch_add(1, Ordering::Release);
    }
}

/// Spins (then yields) until `cond` holds.
fn spin_until(mut cond: impl FnMut() -> bool) {
    let mut spins = 0u32;
    while !cond() {
        spins += 1;
        if spins < 1 << 14 {
            std::hint::spin_loop();
        } else {
            thread::yield_now();
        }
    }
}

impl Pool {
    /// A pool of `threads` participants (the caller counts as one); 0 means all cores.
    pub fn new(threads: usize) -> Pool {
        Pool::with_spin(threads, spin_budget())
    }

    /// As [`Pool::new`], with idle workers spinning for `spin` before they park.
    pub fn with_spin(threads: usize, spin: Duration) -> Pool {
        let threads = if threads == 0 {
            thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
        } else {
            threads
        };
        let shared = Arc::new(Shared {
            open: Padded(AtomicU64::new(0)),
            active: Padded(AtomicUsize::new(0)),
            next: Padded(AtomicUsize::new(0)),
            done: Padded(AtomicUsize::new(0)),
            n_chunks: AtomicUsize::new(0),
            job: AtomicPtr::new(std::ptr::null_mut()),
            panicked: AtomicBool::new(false),
            spin,
            started: AtomicUsize::new(0),
        });
        let workers = (1..threads)
            .map(|idx| {
                let shared = Arc::clone(&shared);
                thread::Builder::new()
                    .name(format!("onebit-pool-{idx}"))
                    .spawn(move || worker(&shared))
                    .expect("spawning a pool thread")
            })
            .collect();
        // The pool is ready when it is returned: every worker's thread has
        // started. A thread's start-up allocates (the standard library
        // records its name for the stack-overflow handler), and a worker
        // the OS starts late would otherwise do so during the first ops,
        // which then never claim a chunk of it (decode_alloc saw 1 in 30).
        spin_until(|| shared.started.load(Ordering::Acquire) == threads - 1);
        Pool {
            inner: Arc::new(Inner {
                threads,
                shared,
                workers,
                dispatch: Mutex::new(0),
            }),
        }
    }

    pub fn threads(&self) -> usize {
        self.inner.threads
    }

    /// Calls `f(c)` once for every chunk `c` in `0..n_chunks`, on all
    /// participants; chunks are claimed from a shared counter in increasing
    /// order, so the split adapts to threads that run slower. A panic in any
    /// chunk is re-raised here after every claimed chunk has finished.
    pub fn for_each_chunk(&self, n_chunks: usize, f: impl Fn(usize) + Sync) {
        let inner = &*self.inner;
        if n_chunks <= 1 || inner.threads == 1 {
            (0..n_chunks).for_each(f);
            return;
        }
        let Ok(mut last_id) = inner.dispatch.try_lock() else {
            // Nested or concurrent use: the workers are busy; run it all here.
            (0..n_chunks).for_each(f);
            return;
        };
        let sh = &*inner.shared;
        let job: JobRef<'_> = &f;
        // SAFETY: only the lifetime is erased. A worker dereferences `slot`
        // (and calls the closure) only while it is counted in `active` and
        // after seeing this op open; this function closes the op and waits for
        // `active` to reach 0 before returning or unwinding, so `job`, `slot`
        // and `f` outlive every use.
        let job_static: JobRef<'static> = unsafe { std::mem::transmute(job) };
        let slot: *const JobRef<'static> = &job_static;
        sh.job.store(slot as *mut _, Ordering::Relaxed);
        sh.n_chunks.store(n_chunks, Ordering::Relaxed);
        sh.next.0.store(0, Ordering::Relaxed);
        sh.done.0.store(0, Ordering::Relaxed);
        *last_id = (*last_id % (SHUTDOWN - 1)) + 1; // 1..SHUTDOWN, never 0
        let id = *last_id;
        // SeqCst (a release): a worker that reads `id` sees the stores above.
        sh.open.0.store(id, Ordering::SeqCst);
        for w in &inner.workers {
            // Cheap when the worker is spinning (an atomic swap), a futex wake
            // when it is parked; park/unpark keep a token, so a wake that comes
            // before the worker parks is not lost.
            w.thread().unpark();
        }
        claim_chunks(sh, job);
        spin_until(|| sh.done.0.load(Ordering::Acquire) == n_chunks);
        // Close, then wait for workers inside. With SeqCst on both sides
        // (worker: increment `active`, then re-read `open`), either the worker
        // sees the op closed and leaves without touching it, or we see it
        // counted and wait.
        sh.open.0.store(0, Ordering::SeqCst);
        // A full fence between the close and the reads of `active` (Dekker's
        // store-then-load). SeqCst on the two accesses alone orders them in
        // the language's model and on aarch64 hardware (stlr, then ldar), but
        // once, under qemu-aarch64 on an x86 host (CI, test-arm), a worker
        // found `job` null after seeing the op open: qemu's translation of
        // stlr/ldar need not fence a store from a later load, and x86 lets the
        // load pass the buffered store. A fence (dmb ish; mfence under qemu)
        // orders them under any translation, once per op.
        fence(Ordering::SeqCst);
        spin_until(|| sh.active.0.load(Ordering::SeqCst) == 0);
        sh.job.store(std::ptr::null_mut(), Ordering::Relaxed);
        if sh.panicked.swap(false, Ordering::Relaxed) {
            drop(last_id);
            resume_unwind(Box::new("a chunk of a pool job panicked"));
        }
    }

    /// Splits `0..n` into at most `threads` contiguous ranges of at least
    /// `min_per_thread` (one range when `n` is smaller) and calls `f` on each,
    /// in parallel; the values come back in range order.
    pub fn map_ranges<T: Send>(
        &self,
        n: usize,
        min_per_thread: usize,
        f: impl Fn(std::ops::Range<usize>) -> T + Sync,
    ) -> Vec<T> {
        let parts = self.threads().min(n / min_per_thread.max(1)).max(1);
        if parts == 1 {
            return vec![f(0..n)];
        }
        let slots: Vec<Mutex<Option<T>>> = (0..parts).map(|_| Mutex::new(None)).collect();
        self.for_each_chunk(parts, |i| {
            let v = f(i * n / parts..(i + 1) * n / parts);
            *slots[i].lock().unwrap_or_else(|e| e.into_inner()) = Some(v);
        });
        slots
            .into_iter()
            .map(|s| {
                s.into_inner()
                    .unwrap_or_else(|e| e.into_inner())
                    .expect("every range ran")
            })
            .collect()
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.shared.open.0.store(SHUTDOWN, Ordering::SeqCst);
        for w in self.workers.drain(..) {
            w.thread().unpark();
            let _ = w.join();
        }
    }
}

fn worker(sh: &Shared) {
    sh.started.fetch_add(1, Ordering::Release);
    let mut seen = 0u64;
    loop {
        let mut since: Option<Instant> = None;
        let mut spins = 0u32;
        let id = loop {
            let id = sh.open.0.load(Ordering::Relaxed);
            if id != 0 && id != seen {
                break id;
            }
            spins = spins.wrapping_add(1);
            if !spins.is_multiple_of(256) {
                std::hint::spin_loop();
                continue;
            }
            let idle = since.get_or_insert_with(Instant::now).elapsed();
            if idle >= sh.spin {
                // Woken by the next op's unpark (or spuriously: re-check).
                thread::park();
            } else if idle >= PURE_SPIN {
                // Past the usual gap between two ops: let a thread that shares
                // this core (our own caller, on a busy machine) run.
                thread::yield_now();
            }
        };
        if id == SHUTDOWN {
            return;
        }
        seen = id;
        sh.active.0.fetch_add(1, Ordering::SeqCst);
        // The other half of the close's fence (see `for_each_chunk`).
        fence(Ordering::SeqCst);
        if sh.open.0.load(Ordering::SeqCst) == id {
            let p = sh.job.load(Ordering::Relaxed);
            // SAFETY: we are counted in `active` and saw op `id` still open
            // after that (SeqCst), so the dispatcher has not closed it and will
            // not return before `active` drops back to 0; it stored `job`
            // before opening the op, and our SeqCst load of `open` acquired
            // that store. So `p` points at a live `JobRef`.
            let job: JobRef<'_> = unsafe { *p };
            claim_chunks(sh, job);
        }
        sh.active.0.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn every_worker_has_started_when_new_returns() {
        for threads in [1, 2, 5] {
            let pool = Pool::new(threads);
            let started = pool.inner.shared.started.load(Ordering::Acquire);
            assert_eq!(started, threads - 1, "threads {threads}");
        }
    }

    #[test]
    fn map_ranges_covers_in_order() {
        for threads in [1, 2, 3, 5] {
            let pool = Pool::new(threads);
            for n in [0, 1, 2, 7, 100] {
                let parts = pool.map_ranges(n, 1, |r| r);
                let flat: Vec<usize> = parts.into_iter().flatten().collect();
                assert_eq!(flat, (0..n).collect::<Vec<_>>(), "threads {threads} n {n}");
            }
        }
    }

    #[test]
    fn chunks_run_once_each_many_times() {
        let pool = Pool::new(3);
        for round in 0..2000 {
            let n = round % 17;
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            pool.for_each_chunk(n, |c| {
                hits[c].fetch_add(1, Ordering::Relaxed);
            });
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
        }
    }

    #[test]
    fn nested_and_concurrent_calls_complete() {
        let pool = Pool::new(2);
        let total = AtomicUsize::new(0);
        pool.for_each_chunk(4, |_| {
            pool.for_each_chunk(3, |_| {
                total.fetch_add(1, Ordering::Relaxed);
            });
        });
        assert_eq!(total.load(Ordering::Relaxed), 12);
        let p2 = pool.clone();
        let h = thread::spawn(move || p2.map_ranges(100, 1, |r| r.len()).iter().sum::<usize>());
        let here: usize = pool.map_ranges(100, 1, |r| r.len()).iter().sum();
        assert_eq!(here, 100);
        assert_eq!(h.join().unwrap(), 100);
    }

    #[test]
    fn a_panicking_job_is_reported_and_the_pool_survives() {
        let pool = Pool::new(2);
        let r = catch_unwind(AssertUnwindSafe(|| {
            pool.for_each_chunk(8, |c| {
                if c == 5 {
                    panic!("boom");
                }
            })
        }));
        assert!(r.is_err());
        assert_eq!(
            pool.map_ranges(10, 1, |r| r.len()).iter().sum::<usize>(),
            10
        );
    }

    #[test]
    fn parked_workers_wake_up() {
        let pool = Pool::with_spin(2, Duration::ZERO);
        for _ in 0..50 {
            thread::sleep(Duration::from_micros(200));
            assert_eq!(pool.map_ranges(10, 1, |r| r.len()), vec![5, 5]);
        }
    }
}

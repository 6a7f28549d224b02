//! Connections, served by hand rather than by `axum::serve` for what it
//! lacks: hyper's header-read timeout (it also bounds how long a kept-alive
//! connection may sit idle: hyper starts it when it waits for the next head),
//! a cap on open connections, and a drain bounded in time.
//!
//! At the cap, a new connection evicts the oldest one that has no request
//! being answered, whatever else it is doing (idle, sending a head, or
//! trickling a body): a request is protected only once its body has arrived
//! whole, so an in-flight generation is never cut, and slow or idle sockets
//! cannot starve a new client or `/health`. When every connection is being
//! answered, the new one is closed at once.
//!
//! A body must also keep up a minimum rate ([`ConnLimits::min_body_rate`],
//! after a grace period), not only arrive within the total body timeout: a
//! client that sends a byte every few seconds is cut off in seconds.
//!
//! A panic while a request is handled (a bug: the tests require none) is
//! caught here and answered as a JSON 500, logged with where it happened;
//! the connection and the other requests go on.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Once};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use axum::Router;
use futures_util::StreamExt;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::{watch, Notify};
use tokio::task::JoinSet;
use tower::ServiceExt;

use crate::metrics::Metrics;

#[derive(Clone, Debug)]
pub struct ConnLimits {
    /// From accept (or the end of the previous response) to a whole head.
    pub header_timeout: Duration,
    /// Open connections at most.
    pub max_connections: usize,
    /// After the shutdown signal, how long running requests may go on.
    pub shutdown_timeout: Duration,
    /// Bytes per second a request body must average once `body_grace` has
    /// passed since its head: `body_grace + received / min_body_rate` is
    /// the deadline for each next byte.
    pub min_body_rate: u64,
    pub body_grace: Duration,
}

impl Default for ConnLimits {
    fn default() -> Self {
        ConnLimits {
            header_timeout: Duration::from_secs(10),
            max_connections: 1024,
            shutdown_timeout: Duration::from_secs(30),
            // 1 KiB/s after 2 s: a 4 MiB body (the default limit) still
            // has an hour, and a client on any real link sends far faster.
            min_body_rate: 1024,
            body_grace: Duration::from_secs(2),
        }
    }
}

struct Entry {
    /// Requests whose body has arrived whole and whose response has not
    /// been sent in full: a connection with one is never evicted.
    answering: Arc<AtomicUsize>,
    evict: Arc<Notify>,
}

#[derive(Default)]
struct Registry {
    next: u64,
    /// By age: the first key is the oldest connection.
    conns: BTreeMap<u64, Entry>,
}

/// One request's count on its connection, undone when the response body
/// is dropped.
struct BusyGuard {
    answering: Arc<AtomicUsize>,
    /// The body arrived whole (so `answering` was counted).
    whole: Arc<AtomicBool>,
}

impl Drop for BusyGuard {
    fn drop(&mut self) {
        if self.whole.load(Ordering::Relaxed) {
            self.answering.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// The error a body gets when it arrives slower than the minimum rate.
#[derive(Debug)]
pub struct SlowBody {
    pub rate: u64,
}

impl std::fmt::Display for SlowBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the request body arrived slower than {} bytes per second",
            self.rate
        )
    }
}

impl std::error::Error for SlowBody {}

/// Whether `e` (or what caused it) is a [`SlowBody`].
pub fn is_slow_body(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(x) = cur {
        if x.is::<SlowBody>() {
            return true;
        }
        cur = x.source();
    }
    false
}

/// A request body held to the minimum rate; marks its request as being
/// answered (see [`Entry::answering`]) once it has arrived whole.
struct Paced {
    inner: hyper::body::Incoming,
    received: u64,
    rate: u64,
    grace: Duration,
    start: tokio::time::Instant,
    sleep: Pin<Box<tokio::time::Sleep>>,
    answering: Arc<AtomicUsize>,
    whole: Arc<AtomicBool>,
}

impl Paced {
    fn deadline(&self) -> tokio::time::Instant {
        let secs = self.received as f64 / self.rate.max(1) as f64;
        self.start + self.grace + Duration::from_secs_f64(secs.min(1e9))
    }

    fn arrived(&self) {
        if !self.whole.swap(true, Ordering::Relaxed) {
            self.answering.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl HttpBody for Paced {
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(d) = frame.data_ref() {
                    this.received += d.len() as u64;
                    let next = this.deadline();
                    this.sleep.as_mut().reset(next);
                }
                if this.inner.is_end_stream() {
                    this.arrived();
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => {
                this.arrived();
                Poll::Ready(None)
            }
            Poll::Pending => match this.sleep.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Some(Err(Box::new(SlowBody { rate: this.rate })))),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

thread_local! {
    /// Where the last panic on this thread happened (set by the hook).
    static PANICKED_AT: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Installs, once, a panic hook that records where a panic happened for
/// [`CatchPanic`] and then runs the hook that was there before.
fn record_panic_locations() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let at = info
                .location()
                .map_or_else(|| "an unknown place".to_string(), |l| l.to_string());
            PANICKED_AT.with(|p| *p.borrow_mut() = Some(at));
            prev(info);
        }));
    });
}

/// A request's future with any panic turned into a JSON 500.
struct CatchPanic<F>(Pin<Box<F>>);

impl<F: Future<Output = Response>> Future for CatchPanic<F> {
    type Output = Response;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Response> {
        let fut = self.0.as_mut();
        // Sound to resume after: the panicking future is dropped with this
        // one and never polled again; what it shared (the engine's channels,
        // atomics, mutexes that poison) stays usable by the others.
        match std::panic::catch_unwind(AssertUnwindSafe(|| fut.poll(cx))) {
            Ok(p) => p,
            Err(payload) => {
                let what = panic_text(&*payload);
                let at = PANICKED_AT
                    .with(|p| p.borrow_mut().take())
                    .unwrap_or_else(|| "an unknown place".into());
                eprintln!("[serve] a request panicked at {at}: {what}; answered 500");
                Poll::Ready(crate::api::ApiError::server(STREAM_FAILED).into_response())
            }
        }
    }
}

/// What a request that panicked is answered with (a 500, or the error
/// event that ends a stream), in each protocol's shape.
pub const STREAM_FAILED: &str = "the server failed on this request (an internal error, logged)";

/// What a panic carried, as text.
fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_default()
}

/// A streamed answer's producer whose panic (a bug) is caught like a
/// request's: logged with where it happened, and the stream ended with
/// `last` (an error event in the protocol's shape) rather than a cut body.
struct CatchStreamPanic<F> {
    fut: Pin<Box<F>>,
    tx: tokio::sync::mpsc::UnboundedSender<Bytes>,
    last: Option<Bytes>,
}

impl<F: Future<Output = ()>> Future for CatchStreamPanic<F> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let fut = self.fut.as_mut();
        // Sound to resume after, as for a request (see CatchPanic): the
        // panicking producer is never polled again.
        match std::panic::catch_unwind(AssertUnwindSafe(|| fut.poll(cx))) {
            Ok(p) => p,
            Err(payload) => {
                let at = PANICKED_AT
                    .with(|p| p.borrow_mut().take())
                    .unwrap_or_else(|| "an unknown place".into());
                eprintln!(
                    "[serve] a stream panicked at {at}: {}; ended with an error event",
                    panic_text(&*payload)
                );
                if let Some(last) = self.last.take() {
                    let _ = self.tx.send(last);
                }
                Poll::Ready(())
            }
        }
    }
}

/// Spawns the producer of a streamed answer that writes into `tx`; a panic
/// in it sends `last` on `tx` and ends the stream there.
pub fn spawn_stream<F>(tx: tokio::sync::mpsc::UnboundedSender<Bytes>, last: Bytes, fut: F)
where
    F: Future<Output = ()> + Send + 'static,
{
    record_panic_locations();
    tokio::spawn(CatchStreamPanic {
        fut: Box::pin(fut),
        tx,
        last: Some(last),
    });
}

/// After the shutdown timeout's `cut`, how long the answers it ends
/// (a stream's error event) get to go out before the connections close.
pub const CUT_GRACE: Duration = Duration::from_secs(1);

/// Serves `router` on `listener` until `shutdown` resolves, then stops
/// accepting and lets running requests finish for `shutdown_timeout` at
/// most; then calls `cut`, which ends what still runs with an error (the
/// engine's requests fail, a stream sends its error event), gives those
/// answers [`CUT_GRACE`] to go out whole, and drops whatever connections
/// remain.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ConnLimits,
    metrics: Arc<Metrics>,
    shutdown: impl Future<Output = ()>,
    cut: impl FnOnce(),
) {
    record_panic_locations();
    let registry = Arc::new(Mutex::new(Registry::default()));
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut tasks = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            r = listener.accept() => {
                let sock = match r {
                    Ok((s, _)) => s,
                    Err(e) => {
                        // Out of descriptors and the like: wait for some to close.
                        eprintln!("[serve] accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = sock.set_nodelay(true);
                let Some((id, entry)) = admit(&registry, limits.max_connections) else {
                    Metrics::add(&metrics.connections_refused, 1);
                    drop(sock);
                    continue;
                };
                metrics.open_connections.fetch_add(1, Ordering::Relaxed);
                tasks.spawn(connection(
                    sock,
                    router.clone(),
                    limits.clone(),
                    entry,
                    stop_rx.clone(),
                    Done { id, registry: registry.clone(), metrics: metrics.clone() },
                ));
            }
        }
    }
    drop(listener);
    let _ = stop_tx.send(true);
    let drained = tokio::time::timeout(limits.shutdown_timeout, async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        eprintln!(
            "[serve] {} connection(s) still open after the {:?} shutdown timeout: ending their requests",
            tasks.len(),
            limits.shutdown_timeout
        );
        cut();
        let flushed = tokio::time::timeout(CUT_GRACE, async {
            while tasks.join_next().await.is_some() {}
        })
        .await;
        if flushed.is_err() {
            eprintln!(
                "[serve] {} connection(s) still open {CUT_GRACE:?} later: closing them",
                tasks.len()
            );
            tasks.abort_all();
            while tasks.join_next().await.is_some() {}
        }
    }
}

/// A slot for a new connection: at the cap, evicts the oldest one not
/// answering a request (idle, or still sending its head or body); `None`
/// when every connection is answering one.
fn admit(registry: &Mutex<Registry>, max: usize) -> Option<(u64, Entry)> {
    let mut r = registry.lock().unwrap_or_else(|p| p.into_inner());
    if r.conns.len() >= max.max(1) {
        let oldest = r
            .conns
            .iter()
            .find(|(_, e)| e.answering.load(Ordering::Relaxed) == 0)
            .map(|(&id, _)| id);
        let id = oldest?;
        // Its task ends and unregisters itself; it no longer counts now.
        if let Some(e) = r.conns.remove(&id) {
            e.evict.notify_one();
        }
    }
    let id = r.next;
    r.next += 1;
    let e = Entry {
        answering: Arc::new(AtomicUsize::new(0)),
        evict: Arc::new(Notify::new()),
    };
    let mine = Entry {
        answering: e.answering.clone(),
        evict: e.evict.clone(),
    };
    r.conns.insert(id, e);
    Some((id, mine))
}

/// Unregisters a connection when its task ends, however it ends.
struct Done {
    id: u64,
    registry: Arc<Mutex<Registry>>,
    metrics: Arc<Metrics>,
}

impl Drop for Done {
    fn drop(&mut self) {
        let mut r = self.registry.lock().unwrap_or_else(|p| p.into_inner());
        r.conns.remove(&self.id);
        self.metrics
            .open_connections
            .fetch_sub(1, Ordering::Relaxed);
    }
}

async fn connection(
    sock: tokio::net::TcpStream,
    router: Router,
    limits: ConnLimits,
    entry: Entry,
    mut stop: watch::Receiver<bool>,
    _done: Done,
) {
    let Entry { answering, evict } = entry;
    let svc = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
        let guard = BusyGuard {
            answering: answering.clone(),
            whole: Arc::new(AtomicBool::new(false)),
        };
        let router = router.clone();
        let start = tokio::time::Instant::now();
        let req = req.map(|inner| {
            let p = Paced {
                inner,
                received: 0,
                rate: limits.min_body_rate,
                grace: limits.body_grace,
                start,
                sleep: Box::pin(tokio::time::sleep_until(start + limits.body_grace)),
                answering: guard.answering.clone(),
                whole: guard.whole.clone(),
            };
            // No body (a GET) or an empty one: it has arrived.
            if p.inner.is_end_stream() {
                p.arrived();
            }
            Body::new(p)
        });
        async move {
            let resp = CatchPanic(Box::pin(async move {
                match router.oneshot(req).await {
                    Ok(r) => r,
                    Err(e) => match e {},
                }
            }))
            .await;
            // A streamed body keeps the connection busy until it has gone out
            // whole or been dropped; a body of known size goes out at once.
            if resp.body().size_hint().exact().is_some() {
                return Ok::<_, Infallible>(resp);
            }
            Ok(resp.map(|b| {
                Body::from_stream(b.into_data_stream().map(move |c| {
                    let _ = &guard;
                    c
                }))
            }))
        }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .keep_alive(true)
        .serve_connection(TokioIo::new(sock), svc);
    tokio::pin!(conn);
    let mut stopping = *stop.borrow();
    if stopping {
        conn.as_mut().graceful_shutdown();
    }
    loop {
        tokio::select! {
            _ = conn.as_mut() => return,
            _ = evict.notified() => return,
            r = stop.changed(), if !stopping => {
                stopping = true;
                if r.is_ok() {
                    conn.as_mut().graceful_shutdown();
                }
            }
        }
    }
}

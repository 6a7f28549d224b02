//! Connections, served by hand rather than by `axum::serve` for what it
//! lacks: hyper's header-read timeout (it also bounds how long a kept-alive
//! connection may sit idle: hyper starts it when it waits for the next head),
//! a cap on open connections, and a drain bounded in time.
//!
//! At the cap, a new connection evicts the oldest one with no request in
//! flight (idle sockets cannot starve `/health`); when every connection has
//! a request running, the new one is closed at once.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, HttpBody};
use axum::extract::Request;
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
}

struct Entry {
    /// Requests whose response has not been sent in full.
    busy: Arc<AtomicUsize>,
    evict: Arc<Notify>,
}

#[derive(Default)]
struct Registry {
    next: u64,
    /// By age: the first key is the oldest connection.
    conns: BTreeMap<u64, Entry>,
}

/// Decrements a connection's busy count when the response body is dropped.
struct BusyGuard(Arc<AtomicUsize>);

impl Drop for BusyGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Serves `router` on `listener` until `shutdown` resolves, then stops
/// accepting, lets running requests finish for `shutdown_timeout` at most,
/// and drops whatever connections remain.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ConnLimits,
    metrics: Arc<Metrics>,
    shutdown: impl Future<Output = ()>,
) {
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
                let Some((id, busy, evict)) = admit(&registry, limits.max_connections) else {
                    Metrics::add(&metrics.connections_refused, 1);
                    drop(sock);
                    continue;
                };
                metrics.open_connections.fetch_add(1, Ordering::Relaxed);
                tasks.spawn(connection(
                    sock,
                    router.clone(),
                    limits.header_timeout,
                    busy,
                    evict,
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
            "[serve] {} connection(s) still open after the {:?} shutdown timeout: closing them",
            tasks.len(),
            limits.shutdown_timeout
        );
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
    }
}

/// A slot for a new connection: evicts the oldest idle one at the cap;
/// `None` when every connection is busy.
fn admit(registry: &Mutex<Registry>, max: usize) -> Option<(u64, Arc<AtomicUsize>, Arc<Notify>)> {
    let mut r = registry.lock().unwrap_or_else(|p| p.into_inner());
    if r.conns.len() >= max.max(1) {
        let oldest_idle = r
            .conns
            .iter()
            .find(|(_, e)| e.busy.load(Ordering::Relaxed) == 0)
            .map(|(&id, _)| id);
        let id = oldest_idle?;
        // Its task ends and unregisters itself; it no longer counts now.
        if let Some(e) = r.conns.remove(&id) {
            e.evict.notify_one();
        }
    }
    let id = r.next;
    r.next += 1;
    let busy = Arc::new(AtomicUsize::new(0));
    let evict = Arc::new(Notify::new());
    r.conns.insert(
        id,
        Entry {
            busy: busy.clone(),
            evict: evict.clone(),
        },
    );
    Some((id, busy, evict))
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
    header_timeout: Duration,
    busy: Arc<AtomicUsize>,
    evict: Arc<Notify>,
    mut stop: watch::Receiver<bool>,
    _done: Done,
) {
    let svc = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
        busy.fetch_add(1, Ordering::Relaxed);
        let guard = BusyGuard(busy.clone());
        let router = router.clone();
        async move {
            let resp = match router.oneshot(req.map(Body::new)).await {
                Ok(r) => r,
                Err(e) => match e {},
            };
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
        .header_read_timeout(header_timeout)
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

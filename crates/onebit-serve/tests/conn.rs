//! Connection handling (issue 31, item 2 and the panic backstop), on
//! `conn::serve` with a small router and no model: slow bodies cannot lock
//! out a new client or `/health`, a body below the minimum rate is cut in
//! seconds, and a panicking handler is one JSON 500, not a lost connection.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::Router;
use onebit_serve::conn::{self, ConnLimits};
use onebit_serve::metrics::Metrics;

/// The server on a free loopback port, on its own thread.
fn start(limits: ConnLimits) -> u16 {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(l.local_addr().unwrap().port()).unwrap();
            let router = Router::new()
                .route("/health", get(|| async { "ok" }))
                .route(
                    "/body",
                    post(|b: Body| async move {
                        match axum::body::to_bytes(b, 1 << 20).await {
                            Ok(b) => (StatusCode::OK, b.len().to_string()),
                            Err(e) if conn::is_slow_body(&e) => {
                                (StatusCode::REQUEST_TIMEOUT, e.to_string())
                            }
                            Err(e) => (StatusCode::BAD_REQUEST, e.to_string()),
                        }
                    }),
                )
                .route("/panic", get(panics));
            conn::serve(
                l,
                router,
                limits,
                Arc::new(Metrics::default()),
                std::future::pending(),
                || {},
            )
            .await;
        });
    });
    rx.recv().unwrap()
}

/// A deliberate bug: the backstop under test.
async fn panics() -> &'static str {
    panic!("a deliberate bug in a handler")
}

/// One request on a fresh connection: the status and body, and how long it took.
fn request(port: u16, req: &str) -> (u16, String, Duration) {
    let t = Instant::now();
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return (0, String::new(), t.elapsed());
    };
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    if s.write_all(req.as_bytes()).is_err() {
        return (0, String::new(), t.elapsed());
    }
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).to_string();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map_or("", |x| x.1).to_string();
    (status, body, t.elapsed())
}

const HEALTH: &str = "GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";

/// The head of a POST whose body will trickle.
const SLOW_HEAD: &str = "POST /body HTTP/1.1\r\nHost: localhost\r\nContent-Length: 100000\r\n\r\nx";

/// 1,100 connections trickling a body (and reopening when cut, as an
/// attacker would) against a cap of 1,024: `/health` on a new connection
/// answers within 1 s throughout. Before the fix a connection reading its
/// body was never evicted, so at the cap every new one was refused.
#[test]
fn slow_bodies_cannot_lock_out_health() {
    let port = start(ConnLimits {
        max_connections: 1024,
        ..ConnLimits::default()
    });
    let stop = Arc::new(AtomicBool::new(false));
    let (ready_tx, ready) = std::sync::mpsc::channel();
    let attacker = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let open = || {
                let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
                s.write_all(SLOW_HEAD.as_bytes()).ok()?;
                Some(s)
            };
            let mut socks: Vec<Option<TcpStream>> = (0..1100).map(|_| open()).collect();
            let opened = socks.iter().filter(|s| s.is_some()).count();
            let _ = ready_tx.send(());
            while !stop.load(Ordering::Relaxed) {
                for s in socks.iter_mut() {
                    let alive = s.as_mut().is_some_and(|c| c.write_all(b"x").is_ok());
                    if !alive {
                        *s = open();
                    }
                }
                std::thread::sleep(Duration::from_millis(300));
            }
            opened
        })
    };
    // Let the attacker fill the slots first.
    ready.recv().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let until = Instant::now() + Duration::from_secs(3);
    let mut worst = Duration::ZERO;
    let mut probes = 0;
    while Instant::now() < until {
        let (status, body, took) = request(port, HEALTH);
        assert_eq!(
            (status, body.as_str()),
            (200, "ok"),
            "probe {probes} after {took:?}"
        );
        worst = worst.max(took);
        probes += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    stop.store(true, Ordering::Relaxed);
    let opened = attacker.join().unwrap();
    assert!(opened > 1024, "only {opened} slow connections were opened");
    assert!(
        worst < Duration::from_secs(1),
        "worst /health took {worst:?}"
    );
    assert!(probes >= 10);
}

/// A body below the minimum rate (here 1 KiB/s after 1 s) is cut within
/// about the grace period, long before the total body timeout; a body
/// that arrives at once is read whole.
#[test]
fn a_body_below_the_minimum_rate_is_cut_in_seconds() {
    let port = start(ConnLimits {
        body_grace: Duration::from_secs(1),
        min_body_rate: 1024,
        ..ConnLimits::default()
    });
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let t = Instant::now();
    s.write_all(b"POST /body HTTP/1.1\r\nHost: localhost\r\nContent-Length: 100\r\n\r\n")
        .unwrap();
    let writer = {
        let mut w = s.try_clone().unwrap();
        std::thread::spawn(move || {
            for _ in 0..40 {
                if w.write_all(b"x").is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        })
    };
    let mut buf = [0u8; 512];
    let n = s.read(&mut buf).unwrap();
    let took = t.elapsed();
    let head = String::from_utf8_lossy(&buf[..n]).to_string();
    assert!(head.starts_with("HTTP/1.1 408"), "{head}");
    assert!(head.contains("slower than 1024 bytes per second"), "{head}");
    assert!(took < Duration::from_secs(3), "cut after {took:?}");
    drop(s);
    writer.join().unwrap();
    let body = "y".repeat(5000);
    let (status, got, _) = request(
        port,
        &format!(
            "POST /body HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        ),
    );
    assert_eq!((status, got.as_str()), (200, "5000"));
}

/// A handler that panics gets its request a JSON 500 (with the server's
/// error shape) instead of a dropped connection, and the server goes on.
#[test]
fn a_panicking_request_is_one_json_500() {
    let port = start(ConnLimits::default());
    let (status, body, _) = request(
        port,
        "GET /panic HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status, 500, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["error"]["type"], "server_error", "{body}");
    let (status, body, _) = request(port, HEALTH);
    assert_eq!((status, body.as_str()), (200, "ok"));
}

/// Issue 31: a streamed answer's producer that panics (a bug) ends its
/// stream with the protocol's error event, `last`, after what it had sent,
/// instead of a cut body; another stream beside it goes on to its end.
#[test]
fn a_stream_whose_producer_panics_ends_with_its_error_event() {
    use axum::body::Bytes;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Bytes>();
        let sent = tx.clone();
        conn::spawn_stream(tx.clone(), Bytes::from_static(b"error event"), async move {
            let _ = sent.send(Bytes::from_static(b"first"));
            tokio::task::yield_now().await;
            let v: Vec<u8> = Vec::new();
            let _ = v[std::hint::black_box(3)];
        });
        let (ok_tx, mut ok_rx) = tokio::sync::mpsc::unbounded_channel::<Bytes>();
        let ok = ok_tx.clone();
        conn::spawn_stream(ok_tx, Bytes::from_static(b"error event"), async move {
            tokio::task::yield_now().await;
            let _ = ok.send(Bytes::from_static(b"done"));
        });
        drop(tx);
        let mut got = Vec::new();
        while let Some(b) = rx.recv().await {
            got.push(b);
        }
        assert_eq!(got, [&b"first"[..], &b"error event"[..]]);
        let mut other = Vec::new();
        while let Some(b) = ok_rx.recv().await {
            other.push(b);
        }
        assert_eq!(other, [&b"done"[..]]);
    });
}

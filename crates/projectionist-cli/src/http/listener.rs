//! The accept loop: at most [`Limits::connections`] open at once, each given
//! [`Limits::header_read`] to send its request's head and [`Limits::connection`] in all.
//! Past the cap it stops accepting, so that new connections wait in the kernel's backlog
//! (no descriptor of ours) until a slot frees.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use super::wait::MAX_WAIT;

/// What the HTTP listener lets its clients hold.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    /// Connections open at once; past it the listener stops accepting until one closes.
    pub(crate) connections: usize,
    /// Time a client has to send its request's line and headers.
    pub(crate) header_read: Duration,
    /// Longest a connection stays open, whatever it does: the longest `/wait` and some room.
    pub(crate) connection: Duration,
    /// `/wait` requests waiting at once; past it 503 with `Retry-After`.
    pub(crate) waits: usize,
}

impl Default for Limits {
    /// Room for probes and scrapers beside the waits, well under a descriptor limit of 256.
    fn default() -> Self {
        Self {
            connections: 128,
            header_read: Duration::from_secs(5),
            connection: MAX_WAIT + Duration::from_secs(10),
            waits: 96,
        }
    }
}

/// A request's line and headers at most: room for a proxy's headers beside `/wait`'s query.
const MAX_HEAD: usize = 16 * 1024;

/// Accepts connections on `listener` for the process's life, serving each with `app`.
pub(super) async fn accept(listener: TcpListener, app: Router, limits: Limits) {
    let slots = Arc::new(Semaphore::new(limits.connections));
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(limits.header_read).keep_alive(false).max_buf_size(MAX_HEAD);
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else { return };
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) if is_connection_error(&e) => continue,
            Err(e) => {
                // Out of descriptors, most often: wait for some to close, as axum does.
                tracing::warn!(error = %e, "HTTP listener cannot accept a connection; trying again in a second.");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        let served = http.serve_connection(TokioIo::new(stream), TowerToHyperService::new(app.clone()));
        tokio::spawn(async move {
            // An error here is the client's (gone, too slow, not HTTP): nothing to report.
            let _ = tokio::time::timeout(limits.connection, served).await;
            drop(slot);
        });
    }
}

/// An error of one connection, not of the listener.
fn is_connection_error(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    matches!(e.kind(), ConnectionRefused | ConnectionAborted | ConnectionReset)
}
#[cfg(test)]
mod tests {
    use std::time::Duration;

    use metrics_exporter_prometheus::PrometheusBuilder;
    use projectionist_kafka::{Engine, EngineConfig};
    use sqlx::PgPool;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    use crate::http::tests::request;

    /// Many more clients than the cap, each sending half a request and holding it: /health
    /// still answers, and the server closes each held connection after the header timeout.
    #[sqlx::test(migrations = false)]
    async fn slow_clients_are_cut_off_and_health_still_answers(pool: PgPool) {
        let engine = Engine::new(pool, EngineConfig::new("localhost:9092"));
        let recorder = PrometheusBuilder::new().build_recorder();
        let limits = super::Limits { connections: 8, header_read: Duration::from_secs(1), ..Default::default() };
        let localhost = "127.0.0.1:0".parse().unwrap();
        let addr =
            crate::http::serve(localhost, recorder.handle(), engine.readiness(), (None, None), limits).await.unwrap();
        let mut slow = Vec::new();
        for _ in 0..limits.connections + 50 {
            let mut stream = TcpStream::connect(addr).await.unwrap();
            stream.write_all(b"GET /health HTTP/1.1\r\nHost: slow\r\n").await.unwrap();
            slow.push(stream);
        }
        let answer = tokio::time::timeout(Duration::from_secs(60), request(addr, "GET", "/health")).await;
        let (status, _, body) = answer.expect("/health answers while slow clients hold connections");
        assert_eq!((status, body.as_str()), (200, "ok\n"));
        for mut stream in slow {
            let mut rest = Vec::new();
            let read = tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut rest)).await;
            let read = read.expect("the server closes a connection whose headers never end");
            assert!(read.is_ok(), "{read:?}");
            let rest = String::from_utf8_lossy(&rest);
            assert!(rest.is_empty() || rest.starts_with("HTTP/1.1 408"), "{rest}");
        }
    }

    /// The table of limits in docs/operations.md says what the code does.
    #[test]
    fn the_operations_page_states_the_limits() {
        let page = include_str!("../../../../docs/operations.md");
        let limits = super::Limits::default();
        let rows = [
            format!("| Connections open at once | {} |", limits.connections),
            format!("| Time to send a request's line and headers | {} s |", limits.header_read.as_secs()),
            format!("| A connection's life | {} s (the longest `/wait` and 10 s) |", limits.connection.as_secs()),
            format!("| A request's line and headers | {} KiB |", super::MAX_HEAD / 1024),
            format!("| `/wait` requests waiting at once | {} |", limits.waits),
        ];
        for row in rows {
            assert!(page.contains(&row), "docs/operations.md lacks {row:?}");
        }
    }
}

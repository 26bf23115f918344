//! The operator's HTTP listener: `/metrics` (Prometheus text format), `/health` (the
//! process is alive), `/ready` (partitions are assigned, PostgreSQL answers, no
//! partition waits for PostgreSQL to come back and none is halted; else 503 saying which)
//! and, on `run`, `/wait` (read your writes: 200 once a projection has applied an event, 504
//! saying where it stands when the timeout passes first, 400 on bad input).
//! GET only, and the connection closes after each response: enough for scrapers and
//! probes, and a client reading to the end of the stream gets exactly one response.
//! Bounded: connections open at once, the time to send a request's head, a connection's
//! life, and `/wait`s at once ([`Limits`]).

mod listener;
mod wait;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use projectionist_kafka::{metrics as m, Readiness};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

pub(crate) use listener::Limits;
pub(crate) use wait::Waits;

/// Installs the Prometheus recorder (once per process) and returns its handle.
pub(crate) fn install_recorder() -> anyhow::Result<PrometheusHandle> {
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Full(m::BATCH_DURATION.into()),
            &[0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0],
        )?
        .set_buckets_for_metric(
            Matcher::Full(m::BATCH_SIZE.into()),
            &[1.0, 10.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0],
        )?
        .install_recorder()?;
    m::describe();
    let upkeep = handle.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            upkeep.run_upkeep();
        }
    });
    Ok(handle)
}

/// Binds `addr` and serves in the background within `limits`; returns the bound address.
pub(crate) async fn serve(
    addr: SocketAddr,
    handle: PrometheusHandle,
    readiness: Readiness,
    (waits, console): (Option<Waits>, Option<Router>),
    limits: Limits,
) -> anyhow::Result<SocketAddr> {
    let listener = TcpListener::bind(addr).await.map_err(|e| {
        let hint = if e.kind() == std::io::ErrorKind::AddrInUse {
            " (another `run` on this host? give each its own --metrics-addr port, 127.0.0.1:0 for any free \
             one, or off)"
        } else {
            ""
        };
        anyhow::anyhow!("cannot listen on {addr} for /metrics, /health and /ready: {e}{hint}")
    })?;
    let bound = listener.local_addr()?;
    let wait_slots = Arc::new(Semaphore::new(limits.waits));
    let mut app = router(Probes { handle, readiness, waits, wait_slots });
    if let Some(console) = console {
        app = app.merge(console);
    }
    tokio::spawn(listener::accept(listener, app, limits));
    Ok(bound)
}

/// What the handlers read.
#[derive(Clone)]
struct Probes {
    handle: PrometheusHandle,
    readiness: Readiness,
    waits: Option<Waits>,
    /// One per `/wait` waiting; none left: 503.
    wait_slots: Arc<Semaphore>,
}

fn router(probes: Probes) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/health", get(health))
        .route("/ready", get(ready))
        .route("/wait", get(wait::wait))
        .fallback(unknown_path)
        .method_not_allowed_fallback(get_only)
        .with_state(probes)
}

async fn metrics(State(probes): State<Probes>) -> Response {
    let pool = probes.readiness.pool();
    let idle = pool.num_idle() as u32;
    metrics::gauge!(m::PG_POOL_CONNECTIONS, "state" => "in_use").set(pool.size().saturating_sub(idle) as f64);
    metrics::gauge!(m::PG_POOL_CONNECTIONS, "state" => "idle").set(idle as f64);
    reply(StatusCode::OK, "text/plain; version=0.0.4", probes.handle.render())
}

async fn health() -> Response {
    reply(StatusCode::OK, "text/plain", "ok\n".to_owned())
}

async fn ready(State(probes): State<Probes>) -> Response {
    let state = probes.readiness.state().await;
    if state.is_ready() {
        reply(StatusCode::OK, "text/plain", "ready\n".to_owned())
    } else {
        // Each halt on its own line: where, why, and whether (and when) it is retried.
        let halts: String = probes.readiness.halts().iter().map(|h| format!("{h}\n")).collect();
        reply(StatusCode::SERVICE_UNAVAILABLE, "text/plain", format!("not ready: {state}\n{halts}"))
    }
}

/// A path we do not serve: 404 for a read, 405 for any other method (as for known paths).
async fn unknown_path(method: Method) -> Response {
    if method == Method::GET || method == Method::HEAD {
        reply(StatusCode::NOT_FOUND, "text/plain", "try /metrics, /health, /ready or /wait\n".to_owned())
    } else {
        get_only().await
    }
}

/// axum adds the `Allow` header on known paths.
async fn get_only() -> Response {
    reply(StatusCode::METHOD_NOT_ALLOWED, "text/plain", "GET only\n".to_owned())
}

/// Every response closes its connection: probes and scrapers send one request each, and an
/// idle kept-alive connection would hold a task for nothing.
fn reply(status: StatusCode, content_type: &'static str, body: String) -> Response {
    let headers = [(header::CONTENT_TYPE, content_type), (header::CONNECTION, "close")];
    (status, headers, body).into_response()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use metrics::Recorder;
    use metrics_exporter_prometheus::PrometheusBuilder;
    use projectionist_core::Projection;
    use projectionist_kafka::{topics, Engine, EngineConfig};
    use sqlx::PgPool;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A projection with no tables: enough for the engine to join a group.
    pub(super) struct Probe;

    #[projectionist_core::async_trait]
    impl Projection<sqlx::PgConnection> for Probe {
        type Event = serde_json::Value;
        fn name(&self) -> &str {
            "http_probe"
        }
    }

    /// One request on its own connection, read to the end: the server must close it.
    pub(super) async fn request(addr: std::net::SocketAddr, method: &str, path: &str) -> (u16, String, String) {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        stream.write_all(format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n").as_bytes()).await.unwrap();
        let mut response = String::new();
        tokio::time::timeout(Duration::from_secs(10), stream.read_to_string(&mut response))
            .await
            .expect("the server closes the connection after one response")
            .unwrap();
        let (head, body) = response.split_once("\r\n\r\n").expect("a complete response");
        let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
        (status, head.to_ascii_lowercase(), body.to_owned())
    }

    #[sqlx::test(migrations = false)]
    async fn serves_probes_and_metrics_and_turns_ready_once_partitions_are_assigned(pool: PgPool) {
        let brokers = std::env::var("KAFKA_BROKERS").unwrap_or_else(|_| "localhost:9092".into());
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
        let unique = format!("{}-{nanos}", std::process::id());
        let topic = format!("test.http.{unique}");
        topics::create_topics(brokers.as_str(), &[topic.as_str()], 1, 1).await.unwrap();
        projectionist_postgres::migrate(&pool, &[&Probe]).await.unwrap();
        let config = EngineConfig::new(brokers)
            .with_group_id(format!("http-{unique}"))
            .with_kafka_property("session.timeout.ms", "6000")
            .with_kafka_property("heartbeat.interval.ms", "500");
        let engine = Engine::new(pool, config).register(Arc::new(Probe), [topic]);

        let recorder = PrometheusBuilder::new().build_recorder();
        let metadata = metrics::Metadata::new(module_path!(), metrics::Level::INFO, None);
        recorder.register_counter(&metrics::Key::from_name("projectionist_probe_total"), &metadata).increment(3);
        let addr = super::serve(
            "127.0.0.1:0".parse().unwrap(),
            recorder.handle(),
            engine.readiness(),
            (None, None),
            super::Limits::default(),
        )
        .await
        .unwrap();
        assert_ne!(addr.port(), 0, "the bound port, not the requested one");

        let (status, head, body) = request(addr, "GET", "/health").await;
        assert_eq!((status, body.as_str()), (200, "ok\n"));
        assert!(head.contains("content-type: text/plain\r\n"), "{head}");
        let (status, head, body) = request(addr, "GET", "/metrics?x=1").await;
        assert_eq!(status, 200);
        assert!(head.contains("content-type: text/plain; version=0.0.4"), "{head}");
        assert!(body.contains("projectionist_probe_total 3"), "{body}");
        let (status, _, body) = request(addr, "GET", "/nope").await;
        assert_eq!((status, body.as_str()), (404, "try /metrics, /health, /ready or /wait\n"));
        let (status, head, body) = request(addr, "POST", "/metrics").await;
        assert_eq!((status, body.as_str()), (405, "GET only\n"));
        assert!(head.contains("allow: get,head"), "{head}");
        let (status, _, body) = request(addr, "DELETE", "/nope").await;
        assert_eq!((status, body.as_str()), (405, "GET only\n"));

        let (status, _, body) = request(addr, "GET", "/ready").await;
        assert_eq!(
            (status, body.as_str()),
            (
                503,
                "not ready: partitions assigned: false, broker answers: true, postgres answers: true, waiting for postgres: false, \
                 waiting for the schema registry: false, partitions halted: 0\n"
            ),
            "not ready before the engine runs"
        );
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let run = tokio::spawn(engine.run(async move {
            let _ = stopped.await;
        }));
        let started = Instant::now();
        loop {
            let (status, _, body) = request(addr, "GET", "/ready").await;
            if status == 200 {
                assert_eq!(body, "ready\n");
                break;
            }
            assert!(started.elapsed() < Duration::from_secs(60), "never ready: {body}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        stop.send(()).unwrap();
        let report = tokio::time::timeout(Duration::from_secs(30), run).await.unwrap().unwrap().unwrap();
        assert!(report.halts().is_empty(), "{:?}", report.halts());
    }
}

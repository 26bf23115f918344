//! The operator's HTTP listener: `/metrics` (Prometheus text format), `/health` (the
//! process is alive) and `/ready` (PostgreSQL answers and partitions are assigned).
//! HTTP/1.1 GET only, one request per connection: enough for scrapers and probes.

use std::net::SocketAddr;
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use projectionist_kafka::{metrics as m, Readiness};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

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

/// Binds `addr` and serves in the background; returns the bound address.
pub(crate) async fn serve(
    addr: SocketAddr,
    handle: PrometheusHandle,
    readiness: Readiness,
) -> anyhow::Result<SocketAddr> {
    let listener = TcpListener::bind(addr).await.map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))?;
    let bound = listener.local_addr()?;
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { continue };
            let (handle, readiness) = (handle.clone(), readiness.clone());
            tokio::spawn(async move {
                if let Err(e) = respond(stream, &handle, &readiness).await {
                    tracing::debug!(error = %e, "HTTP request failed.");
                }
            });
        }
    });
    Ok(bound)
}

async fn respond(mut stream: TcpStream, handle: &PrometheusHandle, readiness: &Readiness) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0_u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 8192 {
        let n = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf))
            .await
            .map_err(|_| std::io::ErrorKind::TimedOut)??;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    let line = String::from_utf8_lossy(&head);
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = path.split('?').next().unwrap_or("");
    let (status, content_type, body) = match (method, path) {
        ("GET", "/metrics") => {
            let pool = readiness.pool();
            let idle = pool.num_idle() as u32;
            metrics::gauge!(m::PG_POOL_CONNECTIONS, "state" => "in_use").set(pool.size().saturating_sub(idle) as f64);
            metrics::gauge!(m::PG_POOL_CONNECTIONS, "state" => "idle").set(idle as f64);
            ("200 OK", "text/plain; version=0.0.4", handle.render())
        }
        ("GET", "/health") => ("200 OK", "text/plain", "ok\n".to_owned()),
        ("GET", "/ready") => {
            let assigned = readiness.partitions_assigned();
            let postgres = readiness.postgres_answers().await;
            if assigned && postgres {
                ("200 OK", "text/plain", "ready\n".to_owned())
            } else {
                let body = format!("not ready: partitions assigned: {assigned}, postgres answers: {postgres}\n");
                ("503 Service Unavailable", "text/plain", body)
            }
        }
        ("GET", _) => ("404 Not Found", "text/plain", "try /metrics, /health or /ready\n".to_owned()),
        _ => ("405 Method Not Allowed", "text/plain", "GET only\n".to_owned()),
    };
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await
}

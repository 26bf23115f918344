//! The operator's console, `/console` on `run`'s HTTP listener: lag per partition (a live
//! chart of the last minutes), halts, rebuilds under way, parked aggregates and dead letters,
//! and the operator's actions on them (retry, discard, skip a lost version) through the
//! same code as the CLI's commands.
//!
//! Off unless `--console`; on a loopback address unless `--console-remote`. Pages are plain
//! HTML rendered here (the chart alone needs JavaScript: uPlot, served from the binary).
//! Actions are POST forms that carry the console's token (`--console-token`, compared in
//! constant time); without a token configured there are none. A request another site sent
//! (`Origin` not this host, or `Sec-Fetch-Site: cross-site`) is refused. Every action is
//! logged with who (the name the operator typed) and what.

mod actions;
mod history;
mod page;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use metrics_exporter_prometheus::PrometheusHandle;
use projectionist_kafka::{KafkaClientConfig, Readiness, Registration};
use projectionist_postgres::PgPool;
use serde::Deserialize;

pub(crate) use crate::config::Payload;
use history::History;

/// The console's settings.
pub(crate) struct Settings {
    /// The token actions need; none: no actions.
    pub token: Option<String>,
    /// The most of a payload shown.
    pub payload: Payload,
    /// Whether a listener on another address than loopback may serve it.
    pub remote: bool,
}

/// What the console reads and acts on besides the listener's own: the database, the
/// brokers, the projections of the run.
pub(crate) type Parts = (PgPool, KafkaClientConfig, Vec<Registration>);

/// What the console reads and acts on.
pub(crate) struct Console {
    pool: PgPool,
    client: KafkaClientConfig,
    registrations: Vec<Registration>,
    handle: PrometheusHandle,
    readiness: Readiness,
    settings: Settings,
    history: Mutex<History>,
}

/// How often lag is sampled for the chart, and how many samples it keeps (15 minutes).
const SAMPLE_EVERY: Duration = Duration::from_secs(5);
const SAMPLES: usize = 180;

impl Console {
    /// The console of a run over `registrations`, and its sampler started; an error when the
    /// listener's address is not loopback and `remote` was not given.
    pub(crate) fn start(
        addr: SocketAddr,
        (pool, client, registrations): Parts,
        (handle, readiness): (PrometheusHandle, Readiness),
        settings: Settings,
    ) -> anyhow::Result<Arc<Self>> {
        if !addr.ip().is_loopback() && !settings.remote {
            anyhow::bail!(
                "--console on {addr}: the console serves only on a loopback address (its pages show offsets, \
                 errors and payloads); give --console-remote to serve it there, behind your own proxy"
            );
        }
        let history = Mutex::new(History::new(SAMPLES));
        let console = Arc::new(Self { pool, client, registrations, handle, readiness, settings, history });
        let sampler = Arc::downgrade(&console);
        tokio::spawn(async move {
            while let Some(console) = sampler.upgrade() {
                console.sample().await;
                drop(console);
                tokio::time::sleep(SAMPLE_EVERY).await;
            }
        });
        Ok(console)
    }

    /// One sample of every partition's lag, into the history.
    async fn sample(&self) {
        let Ok(positions) = crate::status::positions(&self.pool, &self.client, &self.registrations).await else {
            return;
        };
        let seconds = history::lag_seconds(&self.handle.render());
        if let Ok(mut history) = self.history.lock() {
            history.push(&positions, &seconds);
        }
    }
}

/// The console's routes, to merge into the listener's.
pub(crate) fn router(console: Arc<Console>) -> Router {
    Router::new()
        .route("/console", get(overview))
        .route("/console/lag.json", get(lag))
        .route("/console/dead-letters/{id}", get(dead_letter))
        .route("/console/uplot.js", get(|| async { asset("text/javascript", UPLOT_JS) }))
        .route("/console/uplot.css", get(|| async { asset("text/css", UPLOT_CSS) }))
        .route("/console/chart.js", get(|| async { asset("text/javascript", CHART_JS) }))
        .route("/console/dead-letters/{id}/retry", post(actions::retry))
        .route("/console/dead-letters/{id}/discard", post(actions::discard))
        .route("/console/parked/skip", post(actions::skip))
        .with_state(console)
}

const UPLOT_JS: &str = include_str!("../../assets/uplot/uPlot.iife.min.js");
const UPLOT_CSS: &str = include_str!("../../assets/uplot/uPlot.min.css");
const CHART_JS: &str = include_str!("../../assets/console/chart.js");

fn asset(content_type: &'static str, body: &'static str) -> Response {
    let headers = [(header::CONTENT_TYPE, content_type), (header::CACHE_CONTROL, "max-age=3600")];
    (StatusCode::OK, headers, body).into_response()
}

/// An HTML page; every console response closes its connection, as the listener's do.
fn html(status: StatusCode, body: String) -> Response {
    let headers = [
        (header::CONTENT_TYPE, "text/html; charset=utf-8"),
        (header::CONNECTION, "close"),
        (header::CACHE_CONTROL, "no-store"),
        // Not to be framed by another site (clickjacking), and no scripts but ours.
        (header::X_FRAME_OPTIONS, "DENY"),
        (
            header::CONTENT_SECURITY_POLICY,
            "default-src 'self'; style-src 'self' 'unsafe-inline'; frame-ancestors 'none'",
        ),
    ];
    (status, headers, body).into_response()
}

async fn overview(State(console): State<Arc<Console>>) -> Response {
    match page::overview(&console).await {
        Ok(body) => html(StatusCode::OK, body),
        Err(e) => html(StatusCode::SERVICE_UNAVAILABLE, page::error(&format!("{e:#}"))),
    }
}

async fn lag(State(console): State<Arc<Console>>) -> Response {
    let body = console.history.lock().map(|h| h.json()).unwrap_or_default();
    let headers = [(header::CONTENT_TYPE, "application/json"), (header::CACHE_CONTROL, "no-store")];
    (StatusCode::OK, headers, body).into_response()
}

/// `?payload=none|masked|full`: how much of the payload to show, at most the console's.
#[derive(Deserialize)]
struct Shown {
    payload: Option<Payload>,
}

async fn dead_letter(State(console): State<Arc<Console>>, Path(id): Path<i64>, Query(q): Query<Shown>) -> Response {
    let most = console.settings.payload;
    let shown = q.payload.unwrap_or(Payload::Masked).min(most);
    match projectionist_postgres::park::dead_letter(&console.pool, id).await {
        Ok(Some(letter)) => html(StatusCode::OK, page::dead_letter(&letter, shown, most, console.actions())),
        Ok(None) => html(StatusCode::NOT_FOUND, page::error(&format!("no dead letter {id}"))),
        Err(e) => html(StatusCode::SERVICE_UNAVAILABLE, page::error(&e.to_string())),
    }
}

impl Console {
    /// Whether actions are on (a token is configured).
    fn actions(&self) -> bool {
        self.settings.token.is_some()
    }
}

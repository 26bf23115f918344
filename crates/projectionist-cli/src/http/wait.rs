//! `/wait`: read your writes over HTTP.

use std::collections::HashMap;
use std::time::Duration;

use axum::extract::{Query, State};
use axum::http::{header, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use projectionist_kafka::metrics as m;

use super::{reply, Probes};

/// What `/wait` answers from: the read models' database (its waiter, with its listening
/// connection, made at the first request), and the projections it may be asked about.
#[derive(Clone)]
pub(crate) struct Waits {
    pool: sqlx::PgPool,
    waiter: std::sync::Arc<tokio::sync::OnceCell<projectionist_postgres::wait::Waiter>>,
    projections: Vec<projectionist_postgres::SharedProjection>,
}

impl Waits {
    pub(crate) fn new(pool: sqlx::PgPool, projections: Vec<projectionist_postgres::SharedProjection>) -> Self {
        Self { pool, waiter: Default::default(), projections }
    }
}

/// Longest `/wait` holds a request (`timeout_ms` above it is refused).
pub(super) const MAX_WAIT: Duration = Duration::from_secs(30);
/// `/wait`'s timeout when the request names none.
const DEFAULT_WAIT: Duration = Duration::from_secs(5);
/// Longest query string `/wait` reads.
const MAX_QUERY: usize = 4096;
/// Longest value of each text parameter, in bytes: a Kafka topic's name is at most 249.
const MAX_TEXT: [(&str, usize); 4] =
    [("topic", 249), ("projection", 1024), ("aggregate_type", 1024), ("aggregate_id", 1024)];

/// `GET /wait?projection=P&topic=T&partition=N&offset=O[&timeout_ms=MS]`, or
/// `GET /wait?projection=P&aggregate_type=A&aggregate_id=I&version=V[&timeout_ms=MS]`: 200
/// once P has applied the event at offset O of T/N (its checkpoint is past it and the event
/// is in the read model), or the aggregate's rows stand at version V or beyond; past the
/// checkpoint but not applied: 202 when the event is held behind its parked aggregate, 409
/// when it was dead-lettered (or that dead letter discarded), the body's `fate` saying which;
/// 504 when `timeout_ms` (default 5000, at most 30000) passes first; each with a JSON body
/// saying where P stands or what became of the event. 400 on bad input (a query or a
/// parameter too long too); 503 with `Retry-After` when too many wait already.
pub(super) async fn wait(State(probes): State<Probes>, uri: Uri) -> Response {
    let Some(waits) = probes.waits else {
        return reply(StatusCode::NOT_FOUND, "text/plain", "no waits here: /wait is served by `run`\n".to_owned());
    };
    if uri.query().is_some_and(|q| q.len() > MAX_QUERY) {
        return reply(StatusCode::BAD_REQUEST, "text/plain", format!("the query is longer than {MAX_QUERY} bytes\n"));
    }
    let query = match Query::<HashMap<String, String>>::try_from_uri(&uri) {
        Ok(Query(query)) => query,
        Err(rejection) => return rejection.into_response(),
    };
    let wanted = match Wanted::parse(&query, &waits.projections) {
        Ok(wanted) => wanted,
        Err(problem) => return reply(StatusCode::BAD_REQUEST, "text/plain", format!("{problem}\n")),
    };
    // Held to the end: each wait holds a task, a connection and its request.
    let Ok(_slot) = probes.wait_slots.try_acquire() else {
        let body = serde_json::json!({ "applied": false, "error": "too many waits at once; try again" });
        let mut busy = reply(StatusCode::SERVICE_UNAVAILABLE, "application/json", format!("{body}\n"));
        busy.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        return busy;
    };
    let waiter =
        match waits.waiter.get_or_try_init(|| projectionist_postgres::wait::Waiter::new(waits.pool.clone())).await {
            Ok(waiter) => waiter,
            Err(e) => {
                let body = serde_json::json!({ "applied": false, "error": e.to_string() });
                return reply(StatusCode::SERVICE_UNAVAILABLE, "application/json", format!("{body}\n"));
            }
        };
    let waiting = metrics::gauge!(m::WAIT_REQUESTS);
    waiting.increment(1.0);
    let waited = match &wanted.at {
        At::Offset { topic, partition, offset } => {
            let name = wanted.projection.name();
            waiter.wait_for_offset(name, topic, *partition, *offset, wanted.timeout).await
        }
        At::Version { aggregate_type, aggregate_id, version } => {
            let projection = wanted.projection.as_ref();
            waiter.wait_for_version(projection, aggregate_type, aggregate_id, *version, wanted.timeout).await
        }
    };
    waiting.decrement(1.0);
    use projectionist_postgres::wait::{Fate, Position};
    use projectionist_postgres::WaitError;
    let stands = |position: &Position| match position {
        Position::Offset { next_offset } => serde_json::json!({ "next_offset": next_offset }),
        Position::Version { version } => serde_json::json!({ "version": version }),
    };
    let (status, body) = match waited {
        Ok(position) => (StatusCode::OK, serde_json::json!({ "applied": true, "stands": stands(&position) })),
        // Past the checkpoint, but not in the read model: held (it may still apply) or a
        // dead letter (it applies only if an operator retries it).
        Err(projectionist_postgres::Error::Wait(WaitError::NotApplied { fate, .. })) => {
            let status = match fate {
                Fate::Parked { .. } => StatusCode::ACCEPTED,
                Fate::DeadLettered { .. } | Fate::Discarded { .. } => StatusCode::CONFLICT,
            };
            let mut body = serde_json::json!({ "applied": false, "error": fate.to_string() });
            if let (Some(body), serde_json::Value::Object(fate)) = (body.as_object_mut(), serde_json::json!(fate)) {
                body.extend(fate);
            }
            (status, body)
        }
        Err(projectionist_postgres::Error::Wait(WaitError::Timeout { position, .. })) => (
            StatusCode::GATEWAY_TIMEOUT,
            serde_json::json!({ "applied": false, "stands": stands(&position), "error": "timed out" }),
        ),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, serde_json::json!({ "applied": false, "error": e.to_string() })),
    };
    reply(status, "application/json", format!("{body}\n"))
}

/// A `/wait` request, checked.
struct Wanted {
    projection: projectionist_postgres::SharedProjection,
    at: At,
    timeout: Duration,
}

enum At {
    Offset { topic: String, partition: i32, offset: i64 },
    Version { aggregate_type: String, aggregate_id: String, version: i64 },
}

impl Wanted {
    fn parse(
        query: &HashMap<String, String>,
        projections: &[projectionist_postgres::SharedProjection],
    ) -> Result<Self, String> {
        for (name, max) in MAX_TEXT {
            if query.get(name).is_some_and(|v| v.len() > max) {
                return Err(format!("{name} is longer than {max} bytes"));
            }
        }
        let text = |name: &str| query.get(name).filter(|v| !v.is_empty()).ok_or_else(|| format!("{name} is missing"));
        let number = |name: &str| -> Result<i64, String> {
            let value = text(name)?;
            value
                .parse::<i64>()
                .ok()
                .filter(|n| *n >= 0)
                .ok_or_else(|| format!("{name} must be a whole number >= 0, got {value:?}"))
        };
        let name = text("projection")?;
        let projection = projections.iter().find(|p| p.name() == name).cloned().ok_or_else(|| {
            let known: Vec<&str> = projections.iter().map(|p| p.name()).collect();
            format!("no projection named {name:?} here; projections: {}", known.join(", "))
        })?;
        let at = match (query.contains_key("offset"), query.contains_key("version")) {
            (true, false) => At::Offset {
                topic: text("topic")?.clone(),
                partition: i32::try_from(number("partition")?).map_err(|_| "partition is too large".to_owned())?,
                offset: number("offset")?,
            },
            (false, true) => At::Version {
                aggregate_type: text("aggregate_type")?.clone(),
                aggregate_id: text("aggregate_id")?.clone(),
                version: number("version")?,
            },
            _ => {
                return Err(
                    "give either topic, partition and offset, or aggregate_type, aggregate_id and version".to_owned()
                )
            }
        };
        let timeout = match query.get("timeout_ms") {
            None => DEFAULT_WAIT,
            Some(_) => Duration::from_millis(number("timeout_ms")? as u64),
        };
        if timeout > MAX_WAIT {
            return Err(format!("timeout_ms must be at most {}", MAX_WAIT.as_millis()));
        }
        Ok(Self { projection, at, timeout })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use metrics_exporter_prometheus::PrometheusBuilder;
    use projectionist_kafka::{Engine, EngineConfig};
    use sqlx::PgPool;

    use crate::http::tests::{request, Probe};

    /// `/wait`: 400 naming what is wrong, 504 with where the projection stands when the
    /// timeout passes first, 200 once the checkpoint a batch commits is past the offset.
    #[sqlx::test(migrations = false)]
    async fn wait_answers_once_the_checkpoint_is_past_the_offset(pool: PgPool) {
        projectionist_postgres::migrate(&pool, &[&Probe]).await.unwrap();
        let engine = Engine::new(pool.clone(), EngineConfig::new("localhost:9092"));
        let recorder = PrometheusBuilder::new().build_recorder();
        let waits = super::Waits::new(pool.clone(), vec![Arc::new(Probe)]);
        let limits = crate::http::Limits::default();
        let addr = crate::http::serve(
            "127.0.0.1:0".parse().unwrap(),
            recorder.handle(),
            engine.readiness(),
            (Some(waits), None),
            limits,
        )
        .await
        .unwrap();
        let bad = [
            ("/wait", "projection is missing"),
            (
                "/wait?projection=nope&topic=t&partition=0&offset=1",
                "no projection named \"nope\" here; projections: http_probe",
            ),
            (
                "/wait?projection=http_probe&topic=t&partition=0",
                "give either topic, partition and offset, or aggregate_type, aggregate_id and version",
            ),
            (
                "/wait?projection=http_probe&topic=t&partition=x&offset=1",
                "partition must be a whole number >= 0, got \"x\"",
            ),
            (
                "/wait?projection=http_probe&topic=t&partition=0&offset=1&timeout_ms=60000",
                "timeout_ms must be at most 30000",
            ),
        ];
        for (path, problem) in bad {
            let (status, _, body) = request(addr, "GET", path).await;
            assert_eq!((status, body.as_str()), (400, format!("{problem}\n").as_str()), "{path}");
        }
        let (status, head, body) =
            request(addr, "GET", "/wait?projection=http_probe&topic=t&partition=0&offset=5&timeout_ms=200").await;
        assert_eq!(status, 504, "{body}");
        assert!(head.contains("content-type: application/json"), "{head}");
        assert_eq!(body, "{\"applied\":false,\"error\":\"timed out\",\"stands\":{\"next_offset\":null}}\n");
        let (status, _, body) = request(
            addr,
            "GET",
            "/wait?projection=http_probe&aggregate_type=a&aggregate_id=b&version=1&timeout_ms=100",
        )
        .await;
        assert_eq!(
            (status, body.as_str()),
            (504, "{\"applied\":false,\"error\":\"timed out\",\"stands\":{\"version\":null}}\n")
        );

        let waiting = tokio::spawn(request(
            addr,
            "GET",
            "/wait?projection=http_probe&topic=t&partition=0&offset=5&timeout_ms=20000",
        ));
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!waiting.is_finished(), "offset 5 not applied yet");
        let mut conn = pool.acquire().await.unwrap();
        projectionist_postgres::checkpoint::store(&mut conn, "http_probe", "t", 0, None, 6).await.unwrap();
        projectionist_postgres::checkpoint::notify(&mut conn, "http_probe", "t", 0, 6, None).await.unwrap();
        let (status, _, body) = waiting.await.unwrap();
        assert_eq!((status, body.as_str()), (200, "{\"applied\":true,\"stands\":{\"next_offset\":6}}\n"));
    }

    /// More waits at once than the cap: those past it get 503 with `Retry-After` at once.
    /// Parameters past their length are refused with 400 before anything waits.
    #[sqlx::test(migrations = false)]
    async fn waits_past_the_cap_get_503_and_overlong_parameters_400(pool: PgPool) {
        projectionist_postgres::migrate(&pool, &[&Probe]).await.unwrap();
        let engine = Engine::new(pool.clone(), EngineConfig::new("localhost:9092"));
        let recorder = PrometheusBuilder::new().build_recorder();
        let waits = super::Waits::new(pool.clone(), vec![Arc::new(Probe)]);
        let limits = crate::http::Limits { waits: 4, ..Default::default() };
        let localhost = "127.0.0.1:0".parse().unwrap();
        let addr = crate::http::serve(localhost, recorder.handle(), engine.readiness(), (Some(waits), None), limits)
            .await
            .unwrap();
        let path = "/wait?projection=http_probe&topic=t&partition=0&offset=5&timeout_ms=2000";
        let flood: Vec<_> = (0..12).map(|_| tokio::spawn(request(addr, "GET", path))).collect();
        let mut refused = 0;
        for answer in flood {
            let (status, head, body) = answer.await.unwrap();
            match status {
                503 => {
                    assert!(head.contains("\r\nretry-after: 1"), "{head}");
                    refused += 1;
                }
                504 => {}
                _ => panic!("{status} {body}"),
            }
        }
        assert!(refused > 0, "12 waits at once, none refused");

        let long = |name: &str, len: usize| format!("{name}={}", "x".repeat(len));
        let bad = [
            (long("topic", 250), "topic is longer than 249 bytes"),
            (long("aggregate_id", 1025), "aggregate_id is longer than 1024 bytes"),
            (long("aggregate_type", 1025), "aggregate_type is longer than 1024 bytes"),
            (long("projection", 1025), "projection is longer than 1024 bytes"),
            (long("pad", 4096), "the query is longer than 4096 bytes"),
        ];
        for (param, problem) in bad {
            let path = format!("/wait?projection=http_probe&topic=t&partition=0&offset=5&timeout_ms=100&{param}");
            let (status, _, body) = request(addr, "GET", &path).await;
            assert_eq!((status, body.as_str()), (400, format!("{problem}\n").as_str()), "{problem}");
        }
    }
}

//! The PostgreSQL pool of a command: its size, and a connection error told with its cause.

use std::str::FromStr;
use std::time::Duration;

use anyhow::bail;
use projectionist_kafka::{KafkaClientConfig, Registration};
use projectionist_postgres::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

/// Pool size for commands other than `run` and `rebuild`, and for those when the broker
/// cannot say how many partitions there are.
pub(crate) const DEFAULT_SIZE: u32 = 8;

/// The pool size of `run` and `rebuild`: `pg_max_connections` when given, else one
/// connection per partition of the registrations' topics (each applies its batches on its
/// own) plus two, at most 64.
pub(crate) async fn size(
    client: &KafkaClientConfig,
    registrations: &[Registration],
    pg_max_connections: Option<u32>,
) -> u32 {
    match pg_max_connections {
        Some(n) => n.max(1),
        None => partitions(client, registrations).await.map_or(DEFAULT_SIZE, |n| (n + 2).min(64)),
    }
}

/// The pool size of `rebuild`, its shadow's pool included (see
/// [`projectionist_kafka::rebuild::OWN_CONNECTIONS`]): `pg_max_connections` when given, else
/// one connection per partition for the shadow, at most 60, and the rebuild's own.
pub(crate) async fn rebuild_size(
    client: &KafkaClientConfig,
    registrations: &[Registration],
    pg_max_connections: Option<u32>,
) -> anyhow::Result<u32> {
    use projectionist_kafka::rebuild::OWN_CONNECTIONS as OWN;
    match pg_max_connections {
        Some(n) if n <= OWN => bail!(
            "--pg-max-connections {n} is too few for a rebuild: it keeps {OWN} connections for itself (its lock, \
             the live writers it holds back, its checks and swap, its progress) and needs one or more for its \
             shadow's partitions; give at least {}",
            OWN + 1
        ),
        Some(n) => Ok(n),
        None => Ok(partitions(client, registrations).await.map_or(DEFAULT_SIZE, |n| n.min(60)) + OWN),
    }
}

/// Partitions of the registrations' topics: the most a process can be assigned.
async fn partitions(client: &KafkaClientConfig, registrations: &[Registration]) -> Option<u32> {
    let mut n = 0;
    for r in registrations {
        for topic in &r.topics {
            let (c, t) = (client.clone(), topic.clone());
            n += tokio::task::spawn_blocking(move || projectionist_kafka::topics::partitions(c, &t))
                .await
                .ok()?
                .ok()?
                .len() as u32;
        }
    }
    Some(n)
}

pub(crate) async fn open(url: &Option<String>) -> anyhow::Result<PgPool> {
    open_with(url, DEFAULT_SIZE).await
}

pub(crate) async fn open_with(url: &Option<String>, max_connections: u32) -> anyhow::Result<PgPool> {
    let Some(url) = url else { bail!("no database: set DATABASE_URL or pass --database-url") };
    // The URL may hold a password: errors below never repeat it.
    // Only a scheme's characters: whatever comes before a later `://` may be a password.
    let scheme = url.split_once("://").map_or("", |(scheme, _)| scheme);
    let scheme = scheme.chars().all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c)).then_some(scheme);
    if !matches!(scheme, Some("postgres" | "postgresql")) {
        let scheme = scheme.filter(|s| !s.is_empty()).map_or("none".to_owned(), |s| format!("{s:?}"));
        bail!(
            "DATABASE_URL is not a PostgreSQL URL (its scheme is {scheme}): expected \
             postgres://USER:PASSWORD@HOST:PORT/DATABASE"
        );
    }
    let options =
        PgConnectOptions::from_str(url).map_err(|_| anyhow::anyhow!("DATABASE_URL is not a valid PostgreSQL URL"))?;
    let where_ = format!("{}:{}/{}", options.get_host(), options.get_port(), options.get_database().unwrap_or("?"));
    reachable(&options).await.map_err(|e| anyhow::anyhow!("cannot connect to PostgreSQL at {where_}: {e}"))?;
    let connecting =
        PgPoolOptions::new().max_connections(max_connections).acquire_timeout(ACQUIRE).connect_with(options);
    match tokio::time::timeout(ANSWER_WITHIN, connecting).await {
        // One line, the cause said once (sqlx's errors repeat their source in Display).
        Ok(pool) => {
            pool.map_err(|e| anyhow::anyhow!("cannot connect to PostgreSQL at {where_}: {}", pg_connect_reason(&e)))
        }
        Err(_) => bail!(
            "cannot connect to PostgreSQL at {where_}: connected, but no answer within {}s: a proxy or firewall \
             holding the connection, a server too busy to answer, or a listener that is not PostgreSQL's",
            ANSWER_WITHIN.as_secs()
        ),
    }
}

/// How long a pool's connection may be waited for once it is open.
const ACQUIRE: Duration = Duration::from_secs(10);

/// How long PostgreSQL may take to answer the first connection of a command, its host
/// having taken the TCP connection: past it, it is a silent peer, and said so.
const ANSWER_WITHIN: Duration = Duration::from_secs(5);

/// Whether PostgreSQL's host answers on its port, within a few seconds: the pool keeps
/// retrying a refused connection until its acquire timeout and then says only "pool timed
/// out", so a wrong host or port is found here first, with the system's reason. (A Unix
/// socket directory is left to the pool.)
async fn reachable(options: &PgConnectOptions) -> Result<(), String> {
    const WITHIN: Duration = Duration::from_secs(5);
    let host = options.get_host();
    if host.starts_with('/') {
        return Ok(());
    }
    match tokio::time::timeout(WITHIN, tokio::net::TcpStream::connect((host, options.get_port()))).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no answer within {}s", WITHIN.as_secs())),
    }
}

fn pg_connect_reason(e: &sqlx::Error) -> String {
    const TLS: &str = "TLS failed (check sslmode, sslrootcert, sslcert, sslkey)";
    match e {
        sqlx::Error::Tls(inner) => format!("{TLS}: {inner}"),
        // rustls's handshake failures (an untrusted or misnamed certificate) reach sqlx as I/O.
        sqlx::Error::Io(io) => match io.get_ref() {
            Some(inner) if inner.is::<rustls::Error>() => format!("{TLS}: {inner}"),
            _ => e.to_string(),
        },
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_certificate_reads_as_a_tls_failure_and_other_io_errors_as_they_are() {
        let refused = rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
        let tls = pg_connect_reason(&sqlx::Error::Io(std::io::Error::other(refused)));
        assert!(tls.starts_with("TLS failed (check sslmode, sslrootcert, sslcert, sslkey): "), "{tls}");
        assert!(tls.contains("UnknownIssuer"), "{tls}");
        let reset = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset by peer");
        let io = pg_connect_reason(&sqlx::Error::Io(reset));
        assert!(!io.contains("TLS") && io.contains("reset by peer"), "{io}");
    }

    #[tokio::test]
    async fn a_database_url_that_is_refused_is_not_repeated() {
        for url in [
            "projectionist:Sw0rdf1sh@127.0.0.1:5432/db?options=http://x",
            "mysql://root:Sw0rdf1sh@127.0.0.1:3306/db",
            "postgres://u:Sw0rdf1sh@127.0.0.1:notaport/db",
            "postgres://u:Sw0rdf1sh@127.0.0.1:5432/db?sslmode=Sw0rdf1sh",
        ] {
            let err = open_with(&Some(url.to_owned()), 1).await.err().map(|e| format!("{e:#}"));
            let err = err.unwrap_or_else(|| panic!("{url} accepted"));
            assert!(err.contains("DATABASE_URL") && !err.contains("Sw0rdf1sh"), "{url}: {err}");
        }
    }
}

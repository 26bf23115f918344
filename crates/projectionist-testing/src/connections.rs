//! How many connections a process holds at once, counted by PostgreSQL itself: a check of a
//! connection budget (`--pg-max-connections`) from outside the process.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use projectionist_postgres::PgPool;

/// Samples, every 20 ms until [`ConnectionPeak::most`], the connections to `pool`'s database
/// whose `application_name` is the one given (set it in the process's URL:
/// `?application_name=NAME`).
pub struct ConnectionPeak {
    most: Arc<AtomicI64>,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl ConnectionPeak {
    /// Starts sampling the connections named `application_name`.
    pub fn start(pool: &PgPool, application_name: &str) -> Self {
        let (most, stop) = (Arc::new(AtomicI64::new(0)), Arc::new(AtomicBool::new(false)));
        let (pool, app, seen, stopped) = (pool.clone(), application_name.to_owned(), most.clone(), stop.clone());
        let task = tokio::spawn(async move {
            while !stopped.load(Ordering::SeqCst) {
                let sql = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND \
                           application_name = $1";
                let n: i64 = sqlx::query_scalar(sql).bind(&app).fetch_one(&pool).await.expect("pg_stat_activity");
                seen.fetch_max(n, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        Self { most, stop, task }
    }

    /// Stops sampling: the most connections seen open at once.
    pub async fn most(self) -> i64 {
        self.stop.store(true, Ordering::SeqCst);
        self.task.await.expect("the sampling task");
        self.most.load(Ordering::SeqCst)
    }
}

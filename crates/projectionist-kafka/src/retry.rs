//! The one retry policy, used for a batch and for the checkpoint read on assignment alike:
//! a failure of the environment (PostgreSQL unreachable, restarting, read-only) is waited
//! out for as long as it lasts; any other transient failure is retried a bounded number of
//! times; the rest is returned at once. Delays grow exponentially in both cases.

use std::future::Future;
use std::time::Duration;

/// How and how patiently a transient failure is retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Retries of a [`Retry::Bounded`] failure after the first attempt.
    pub max_retries: u32,
    /// First delay, doubled on each further retry (capped at [`RetryPolicy::MAX_DELAY`],
    /// and at [`RetryPolicy::MAX_WAIT_DELAY`] while waiting out the environment).
    pub backoff: Duration,
}

/// What a failure calls for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// Nothing: trying again cannot help.
    Never,
    /// Trying again may help, a bounded number of times ([`RetryPolicy::max_retries`]):
    /// a serialization failure, a deadlock, a concurrent write.
    Bounded,
    /// The environment failed, not the work: try again for as long as it lasts, without
    /// counting against the bound.
    WaitOut,
    /// Every connection of the process's pool is in use by its other partitions (its
    /// `--pg-max-connections` budget): queue for one again, at once, without counting.
    Queue,
}

/// One failure about to be retried, for logs and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retrying {
    /// What the failure calls for ([`Retry::Bounded`], [`Retry::WaitOut`] or [`Retry::Queue`]).
    pub kind: Retry,
    /// Failures of this kind so far in this run, this one included.
    pub attempt: u32,
    /// The delay before the next attempt.
    pub delay: Duration,
}

impl Retry {
    /// What a failed PostgreSQL attempt calls for: the environment's failures
    /// ([`projectionist_postgres::Error::is_environment`]) are waited out, other transient
    /// ones ([`projectionist_postgres::Error::is_retryable`]) retried a bounded number of
    /// times.
    pub fn of(e: &projectionist_postgres::Error) -> Self {
        if e.is_environment() {
            Self::WaitOut
        } else if e.is_retryable() {
            Self::Bounded
        } else {
            Self::Never
        }
    }

    /// As [`Retry::of`], telling a wait for a connection of `pool` apart from an outage: a
    /// pool that timed out with all its connections open is busy, not cut off from
    /// PostgreSQL (an outage closes connections, and the pool cannot open new ones).
    pub fn in_pool(e: &projectionist_postgres::Error, pool: &projectionist_postgres::PgPool) -> Self {
        let timed_out = matches!(e, projectionist_postgres::Error::Database(sqlx::Error::PoolTimedOut));
        if timed_out && pool.size() >= pool.options().get_max_connections() {
            Self::Queue
        } else {
            Self::of(e)
        }
    }
}

impl RetryPolicy {
    /// The longest single delay of a bounded retry.
    pub const MAX_DELAY: Duration = Duration::from_secs(30);

    /// The longest single delay while waiting out the environment (unless
    /// [`RetryPolicy::backoff`] is longer): short enough that applying resumes within
    /// seconds of PostgreSQL's return, long enough not to hammer a database starting up.
    pub const MAX_WAIT_DELAY: Duration = Duration::from_secs(5);

    /// The delay before bounded retry number `retry` (0-based).
    pub fn delay(&self, retry: u32) -> Duration {
        self.backoff.saturating_mul(1 << retry.min(16)).min(Self::MAX_DELAY)
    }

    /// The delay before attempt number `wait` + 2 while waiting out the environment.
    pub fn wait_delay(&self, wait: u32) -> Duration {
        self.backoff.saturating_mul(1 << wait.min(16)).min(Self::MAX_WAIT_DELAY.max(self.backoff))
    }

    /// Runs `attempt` until it succeeds or fails with an error `classify` says cannot be
    /// retried (any more: bounded retries are spent); `on_retry` sees each failure that is
    /// retried.
    pub async fn run<T, E, F, Fut>(
        &self,
        attempt: F,
        classify: impl Fn(&E) -> Retry,
        on_retry: impl FnMut(&E, Retrying),
    ) -> Result<T, E>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        match self.run_until(attempt, classify, on_retry, std::future::pending()).await {
            Some(result) => result,
            None => unreachable!("a pending future never completes"),
        }
    }

    /// As [`RetryPolicy::run`], giving up between attempts once `stop` completes (an attempt
    /// under way is never interrupted): `None` then.
    pub async fn run_until<T, E, F, Fut>(
        &self,
        mut attempt: F,
        classify: impl Fn(&E) -> Retry,
        mut on_retry: impl FnMut(&E, Retrying),
        stop: impl Future<Output = ()>,
    ) -> Option<Result<T, E>>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        tokio::pin!(stop);
        let (mut retries, mut waits, mut queued) = (0, 0, 0);
        loop {
            let e = match attempt().await {
                Err(e) => e,
                ok => return Some(ok),
            };
            let retrying = match classify(&e) {
                Retry::WaitOut => {
                    waits += 1;
                    Retrying { kind: Retry::WaitOut, attempt: waits, delay: self.wait_delay(waits - 1) }
                }
                Retry::Queue => {
                    queued += 1;
                    Retrying { kind: Retry::Queue, attempt: queued, delay: Duration::ZERO }
                }
                Retry::Bounded if retries < self.max_retries => {
                    retries += 1;
                    Retrying { kind: Retry::Bounded, attempt: retries, delay: self.delay(retries - 1) }
                }
                Retry::Bounded | Retry::Never => return Some(Err(e)),
            };
            on_retry(&e, retrying);
            tokio::select! {
                biased;
                () = &mut stop => return None,
                () = tokio::time::sleep(retrying.delay) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::{Cell, RefCell};

    #[test]
    fn delays_double_and_are_capped() {
        let p = RetryPolicy { max_retries: 5, backoff: Duration::from_millis(100) };
        assert_eq!([0, 1, 2, 3].map(|r| p.delay(r).as_millis()), [100, 200, 400, 800]);
        assert_eq!(p.delay(40), RetryPolicy::MAX_DELAY);
        assert_eq!([0, 1, 2].map(|r| p.wait_delay(r).as_millis()), [100, 200, 400]);
        assert_eq!(p.wait_delay(40), RetryPolicy::MAX_WAIT_DELAY);
        let slow = RetryPolicy { max_retries: 5, backoff: Duration::from_secs(8) };
        assert_eq!(slow.wait_delay(3), Duration::from_secs(8), "never below the configured backoff");
    }

    #[tokio::test(start_paused = true)]
    async fn retries_only_what_is_retryable_and_only_so_often() {
        let p = RetryPolicy { max_retries: 2, backoff: Duration::from_millis(10) };
        let calls = Cell::new(0);
        let seen = Cell::new(0);
        let r: Result<(), &str> = p
            .run(
                || {
                    calls.set(calls.get() + 1);
                    async { Err("transient") }
                },
                |_| Retry::Bounded,
                |_, _| seen.set(seen.get() + 1),
            )
            .await;
        assert_eq!((r, calls.get(), seen.get()), (Err("transient"), 3, 2));

        calls.set(0);
        let r: Result<(), &str> = p
            .run(
                || {
                    calls.set(calls.get() + 1);
                    async { Err("fatal") }
                },
                |e| if *e == "fatal" { Retry::Never } else { Retry::Bounded },
                |_, _| {},
            )
            .await;
        assert_eq!((r, calls.get()), (Err("fatal"), 1));

        calls.set(0);
        let r: Result<u8, &str> = p
            .run(
                || {
                    calls.set(calls.get() + 1);
                    let n = calls.get();
                    async move {
                        if n < 2 {
                            Err("transient")
                        } else {
                            Ok(7)
                        }
                    }
                },
                |_| Retry::Bounded,
                |_, _| {},
            )
            .await;
        assert_eq!((r, calls.get()), (Ok(7), 2));
    }

    #[tokio::test(start_paused = true)]
    async fn the_environment_is_waited_out_without_spending_the_bounded_retries() {
        let p = RetryPolicy { max_retries: 2, backoff: Duration::from_millis(10) };
        // 100 outage failures, then two conflicts (within the bound), then success.
        let calls = Cell::new(0);
        let seen = RefCell::new(Vec::new());
        let started = tokio::time::Instant::now();
        let r: Result<u32, &str> = p
            .run(
                || {
                    calls.set(calls.get() + 1);
                    let n = calls.get();
                    async move {
                        match n {
                            ..=100 => Err("outage"),
                            101..=102 => Err("conflict"),
                            _ => Ok(n),
                        }
                    }
                },
                |e| if *e == "outage" { Retry::WaitOut } else { Retry::Bounded },
                |_, r| seen.borrow_mut().push(r),
            )
            .await;
        assert_eq!(r, Ok(103));
        let seen = seen.into_inner();
        assert_eq!(seen.len(), 102);
        assert_eq!(seen[99], Retrying { kind: Retry::WaitOut, attempt: 100, delay: RetryPolicy::MAX_WAIT_DELAY });
        assert_eq!(seen[101], Retrying { kind: Retry::Bounded, attempt: 2, delay: Duration::from_millis(20) });
        assert!(started.elapsed() >= RetryPolicy::MAX_WAIT_DELAY * 90, "capped exponential delays between attempts");

        // A third bounded failure after the outage still halts: the bound is its own.
        calls.set(0);
        let r: Result<u32, &str> = p
            .run(
                || {
                    calls.set(calls.get() + 1);
                    let n = calls.get();
                    async move { Err(if n <= 5 { "outage" } else { "conflict" }) }
                },
                |e| if *e == "outage" { Retry::WaitOut } else { Retry::Bounded },
                |_, _| {},
            )
            .await;
        assert_eq!((r, calls.get()), (Err("conflict"), 8));
    }

    #[tokio::test(start_paused = true)]
    async fn a_busy_pool_is_queued_for_at_once_without_spending_the_bound() {
        let p = RetryPolicy { max_retries: 1, backoff: Duration::from_millis(10) };
        let calls = Cell::new(0);
        let seen = RefCell::new(Vec::new());
        let started = tokio::time::Instant::now();
        let r: Result<u32, &str> = p
            .run(
                || {
                    calls.set(calls.get() + 1);
                    let n = calls.get();
                    async move {
                        if n <= 5 {
                            Err("busy")
                        } else {
                            Ok(n)
                        }
                    }
                },
                |_| Retry::Queue,
                |_, r| seen.borrow_mut().push(r),
            )
            .await;
        assert_eq!(r, Ok(6));
        assert_eq!(seen.borrow()[4], Retrying { kind: Retry::Queue, attempt: 5, delay: Duration::ZERO });
        assert_eq!(started.elapsed(), Duration::ZERO, "queued again at once: the pool's own wait is the delay");
    }

    #[tokio::test]
    async fn a_pool_timeout_is_an_outage_unless_every_connection_is_open() {
        use projectionist_postgres::Error;
        // Nothing opened yet (PostgreSQL never reached): the timeout is the environment's.
        let unopened = sqlx::postgres::PgPoolOptions::new()
            .max_connections(2)
            .connect_lazy("postgres://nobody@127.0.0.1:1/none")
            .unwrap();
        let timed_out = Error::Database(sqlx::Error::PoolTimedOut);
        assert_eq!(Retry::in_pool(&timed_out, &unopened), Retry::WaitOut);
        let refused = Error::Conflict { detail: "moved".into() };
        assert_eq!(Retry::in_pool(&refused, &unopened), Retry::Bounded);
    }

    #[test]
    fn postgres_failures_are_classified_at_the_boundary() {
        use projectionist_postgres::Error;
        assert_eq!(Retry::of(&Error::Database(sqlx::Error::PoolTimedOut)), Retry::WaitOut);
        assert_eq!(Retry::of(&Error::Conflict { detail: "moved".into() }), Retry::Bounded);
        assert_eq!(Retry::of(&Error::Database(sqlx::Error::RowNotFound)), Retry::Never);
    }

    #[tokio::test(start_paused = true)]
    async fn a_stop_ends_the_wait_between_attempts() {
        let p = RetryPolicy { max_retries: 2, backoff: Duration::from_millis(10) };
        let calls = Cell::new(0);
        let r: Option<Result<(), &str>> = p
            .run_until(
                || {
                    calls.set(calls.get() + 1);
                    async { Err("outage") }
                },
                |_| Retry::WaitOut,
                |_, _| {},
                tokio::time::sleep(Duration::from_secs(60)),
            )
            .await;
        assert_eq!(r, None);
        assert!((15..=25).contains(&calls.get()), "about 60 s of 5 s waits after the first ones: {}", calls.get());
    }
}

//! The one retry policy: a bounded number of retries with exponential backoff, used for a
//! batch that fails with a retryable database error and for the checkpoint read on
//! assignment alike.

use std::future::Future;
use std::time::Duration;

/// How often and how patiently a transient failure is retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Retries after the first attempt.
    pub max_retries: u32,
    /// First delay, doubled on each further retry (capped at [`RetryPolicy::MAX_DELAY`]).
    pub backoff: Duration,
}

impl RetryPolicy {
    /// The longest single delay.
    pub const MAX_DELAY: Duration = Duration::from_secs(30);

    /// The delay before retry number `retry` (0-based).
    pub fn delay(&self, retry: u32) -> Duration {
        self.backoff.saturating_mul(1 << retry.min(16)).min(Self::MAX_DELAY)
    }

    /// Runs `attempt` until it succeeds, fails with an error `retryable` rejects, or the
    /// retries are spent; `on_retry` sees each failure that is retried, with its delay.
    pub async fn run<T, E, F, Fut>(
        &self,
        mut attempt: F,
        retryable: impl Fn(&E) -> bool,
        mut on_retry: impl FnMut(&E, u32, Duration),
    ) -> Result<T, E>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let mut retry = 0;
        loop {
            match attempt().await {
                Err(e) if retry < self.max_retries && retryable(&e) => {
                    let delay = self.delay(retry);
                    on_retry(&e, retry + 1, delay);
                    tokio::time::sleep(delay).await;
                    retry += 1;
                }
                other => return other,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn delays_double_and_are_capped() {
        let p = RetryPolicy { max_retries: 5, backoff: Duration::from_millis(100) };
        assert_eq!([0, 1, 2, 3].map(|r| p.delay(r).as_millis()), [100, 200, 400, 800]);
        assert_eq!(p.delay(40), RetryPolicy::MAX_DELAY);
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
                |_| true,
                |_, _, _| seen.set(seen.get() + 1),
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
                |e| *e != "fatal",
                |_, _, _| {},
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
                |_| true,
                |_, _, _| {},
            )
            .await;
        assert_eq!((r, calls.get()), (Ok(7), 2));
    }
}

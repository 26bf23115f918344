//! `parked` and `dead-letters`: the events held back, listed, shown, and resolved by an
//! operator (a missing version skipped, a dead letter retried or discarded).

use anyhow::bail;
use projectionist_kafka::Registration;
use projectionist_postgres::park::{self, Resolve};
use projectionist_postgres::PgPool;

use crate::args::{DeadLettersCommand, ParkedCommand};
use crate::{status, App};

impl App {
    /// `parked`: the parked aggregates listed, or one's missing version skipped.
    pub(crate) async fn parked(
        &self,
        pool: &PgPool,
        projection: Option<String>,
        json: bool,
        action: Option<ParkedCommand>,
    ) -> anyhow::Result<()> {
        let Some(ParkedCommand::Skip { projection, aggregate_type, aggregate_id, reason }) = action else {
            return status::print_parked(pool, projection.as_deref(), json).await;
        };
        let aggregate = (aggregate_type.as_str(), aggregate_id.as_str());
        println!("{}", skip(pool, &self.registrations, &projection, aggregate, &reason).await?);
        Ok(())
    }

    /// `dead-letters list|show|retry|discard|purge`.
    pub(crate) async fn dead_letters(&self, pool: &PgPool, command: DeadLettersCommand) -> anyhow::Result<()> {
        match command {
            DeadLettersCommand::List { projection, all, json } => {
                status::print_dead_letters(pool, projection.as_deref(), all, json).await?;
            }
            DeadLettersCommand::Show { id, json } => status::print_dead_letter(pool, id, json).await?,
            DeadLettersCommand::Retry { id, all } => {
                status::engine_tables(pool).await?;
                let ids = match id {
                    Some(id) => vec![id],
                    None if all => park::dead_letters(pool, None, false).await?.iter().map(|d| d.id).collect(),
                    None => bail!("name a dead letter, or --all"),
                };
                let mut failing = 0;
                for id in ids {
                    failing += usize::from(!self.resolve(pool, id, Resolve::Retry).await?);
                }
                if failing > 0 {
                    bail!("{failing} dead letter(s) still fail (`dead-letters show ID` gives the error)");
                }
            }
            DeadLettersCommand::Discard { id, reason } => {
                status::engine_tables(pool).await?;
                self.resolve(pool, id, Resolve::Discard { reason }).await?;
            }
            DeadLettersCommand::Purge { projection, older_than } => {
                status::engine_tables(pool).await?;
                let before = match older_than {
                    Some(age) => {
                        let now = sqlx::types::chrono::Utc::now().timestamp();
                        let then = i64::try_from(age.as_secs()).ok().and_then(|age| now.checked_sub(age));
                        let then = then.and_then(|then| sqlx::types::chrono::DateTime::from_timestamp(then, 0));
                        Some(then.ok_or_else(|| anyhow::anyhow!("--older-than {age:?}: too long ago"))?)
                    }
                    None => None,
                };
                let purged = park::purge(pool, projection.as_deref(), before).await?;
                println!(
                    "{} resolved dead letter(s) deleted; {} discarded one(s) kept without their payload (a replay \
                     still skips their events)",
                    purged.deleted, purged.emptied
                );
            }
        }
        Ok(())
    }

    /// Retries or discards dead letter `id` with its projection, and says what happened:
    /// whether it is resolved.
    async fn resolve(&self, pool: &PgPool, id: i64, action: Resolve) -> anyhow::Result<bool> {
        let (resolved, said) = resolve(pool, &self.registrations, id, action).await?;
        println!("{said}");
        Ok(resolved)
    }
}

/// Skips the version `aggregate` (type, id) of `projection` waits for, accepting its loss,
/// and says what happened. The CLI's `parked skip` and the console's.
pub(crate) async fn skip(
    pool: &PgPool,
    registrations: &[Registration],
    projection: &str,
    (aggregate_type, aggregate_id): (&str, &str),
    reason: &str,
) -> anyhow::Result<String> {
    status::engine_tables(pool).await?;
    let Some(registration) = registrations.iter().find(|r| r.projection.name() == projection) else {
        bail!("projection {projection} is not one this binary runs");
    };
    let p = registration.projection.as_ref();
    let skipped = park::skip_gap(pool, p, aggregate_type, aggregate_id, reason).await?;
    let drained = skipped.drained.total();
    Ok(format!(
        "{aggregate_type}/{aggregate_id}: the version it waited for skipped; {drained} held event(s) applied after it"
    ))
}

/// Retries or discards dead letter `id` with its projection: whether it is resolved, and
/// what happened. The CLI's `dead-letters retry|discard` and the console's.
pub(crate) async fn resolve(
    pool: &PgPool,
    registrations: &[Registration],
    id: i64,
    action: Resolve,
) -> anyhow::Result<(bool, String)> {
    let Some(letter) = park::dead_letter(pool, id).await? else {
        bail!("no dead letter {id} (`dead-letters list` shows them)");
    };
    let Some(registration) = registrations.iter().find(|r| r.projection.name() == letter.projection) else {
        bail!("dead letter {id} is of projection {}, which this binary does not run", letter.projection);
    };
    let resolved = park::resolve(pool, registration.projection.as_ref(), id, action).await?;
    let drained = resolved.drained.total();
    let what = match resolved.outcome {
        projectionist_core::Outcome::Applied => "applied".to_owned(),
        projectionist_core::Outcome::Ignored => "discarded".to_owned(),
        projectionist_core::Outcome::DeadLettered => {
            format!("still fails: {}", resolved.error.as_deref().unwrap_or("?"))
        }
        projectionist_core::Outcome::Parked => "parked: its own predecessor is missing (`parked`)".to_owned(),
        other => format!("{other} (the read model was past it already)"),
    };
    let said = format!("dead letter {id}: {what}; {drained} held event(s) applied after it");
    Ok((resolved.outcome != projectionist_core::Outcome::DeadLettered, said))
}

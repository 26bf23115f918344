//! The event types a projection's tables were built for (`projectionist_built_for`): what
//! the release that made them handles, recorded by its `migrate` and by its rebuild's swap.
//! A release that does not handle one of them (the one before, still running beside a
//! deploy) halts at such an event instead of skipping it as an unknown type: skipped, its
//! version would move the gate, and the next release would start past it with its column
//! never written.

use sqlx::PgConnection;

use crate::error::Error;
use crate::error::EventErrorKind;
use crate::error::Result;
use crate::projection::prepared::Prepared;
use crate::projection::prepared::Step;
use crate::projection::PgProjection;

/// Records the types `projection` (this release of it) handles as those its tables are
/// built for. A projection offered every type records nothing.
pub(crate) async fn record(conn: &mut PgConnection, projection: &dyn PgProjection) -> Result<()> {
    let types = projection.event_types();
    if types.is_empty() {
        return Ok(());
    }
    sqlx::query(
        "INSERT INTO projectionist_built_for (projection, event_types) VALUES ($1, $2) \
         ON CONFLICT (projection) DO UPDATE SET event_types = EXCLUDED.event_types, swapped_at = now()",
    )
    .bind(projection.name())
    .bind(types)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// The first event of `prepared` whose type this release ignores but the tables were built
/// for, as the error that halts the partition at it; read only when the batch ignores some
/// type (in the batch's transaction, under the swap lock, so no swap lands in between).
pub(crate) async fn check(conn: &mut PgConnection, projection: &dyn PgProjection, prepared: &Prepared) -> Result<()> {
    // An event whose type the decoder has no variant for is `Ignored`: this release ignores it.
    let ignored = |step: &Step| matches!(step, Step::Ignored(_));
    if projection.event_types().is_empty() || !prepared.events.iter().any(|e| ignored(&e.step)) {
        return Ok(());
    }
    let built_for: Option<(Vec<String>, String)> =
        sqlx::query_as("SELECT event_types, swapped_at::text FROM projectionist_built_for WHERE projection = $1")
            .bind(projection.name())
            .fetch_optional(&mut *conn)
            .await?;
    let Some((types, at)) = built_for else { return Ok(()) };
    for (index, event) in prepared.events.iter().enumerate() {
        let Step::Ignored(event_type) = &event.step else { continue };
        if types.contains(event_type) {
            let problem = format!(
                "its type {event_type:?} is one the projection's tables were built for (by the release that \
                 migrated or rebuilt them at {at}), and this release does not handle it: it stops here rather \
                 than skip it. Restart the projector with that release (docs/operations.md, \"Deploying a new \
                 release\")"
            );
            return Err(Error::event(index, event.aggregate(), event.version, EventErrorKind::Release(problem)));
        }
    }
    Ok(())
}

//! What the property tests of the write model share: a stream applied in random batches
//! set-based or event by event, or folded as a rebuild's bulk load folds it, on an emptied
//! read model; and what the result is compared by.

// Each test file that includes this module uses a part of it.
#![allow(dead_code)]

use projectionist::postgres::park::{Source, SourceMessage};
use projectionist::postgres::{
    apply_batch_knowing, checked_tables, reset, Folding, KnownVersions, Mode, PgProjection, Policy,
};
use projectionist::{Outcome, RawEnvelope};
use projectionist_testing::dump_tables;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sqlx::PgPool;

/// Applies `stream` on an emptied read model (nothing parked) in random batches, in `mode`,
/// with `policy`, each batch reading only the versions the earlier ones did not leave (as a
/// partition of the engine remembers them); returns each event's outcome and the tables.
pub async fn run(
    pool: &PgPool,
    projection: &dyn PgProjection,
    stream: &[RawEnvelope],
    (mode, policy): (Mode, Policy),
    seed: u64,
) -> (Vec<Outcome>, serde_json::Value) {
    emptied(pool, projection).await;
    let mut rng = StdRng::seed_from_u64(seed);
    let mut outcomes = Vec::new();
    let mut rest = stream;
    let known = KnownVersions::new();
    while !rest.is_empty() {
        let (batch, tail) = rest.split_at(rng.gen_range(1..=80).min(rest.len()));
        outcomes.extend(
            apply_batch_knowing(pool, projection, batch, (mode, policy), &known)
                .await
                .unwrap_or_else(|e| panic!("{} {mode:?}: {e}", projection.name())),
        );
        rest = tail;
    }
    (outcomes, dump_tables(pool, projection).await)
}

/// Empties `projection`'s read model and what it parked and dead-lettered.
pub async fn emptied(pool: &PgPool, projection: &dyn PgProjection) {
    reset(pool, projection).await.unwrap();
    for table in ["projectionist_parked", "projectionist_held", "projectionist_dead_letters"] {
        sqlx::query(&format!("DELETE FROM {table} WHERE projection = $1"))
            .bind(projection.name())
            .execute(pool)
            .await
            .unwrap();
    }
}

/// Applies `stream` on an emptied read model in random batches as a rebuild's bulk load does
/// (see `Folding`): each batch folded in memory when it can be, else written as usual after
/// what the fold holds; the fold written at random points and at the end.
pub async fn run_folded(
    pool: &PgPool,
    projection: &dyn PgProjection,
    stream: &[RawEnvelope],
    policy: Policy,
    (seed, max_batch): (u64, usize),
) -> (Vec<Outcome>, serde_json::Value, usize) {
    emptied(pool, projection).await;
    let checked = checked_tables(pool, projection).await.unwrap();
    let mut conn = pool.acquire().await.unwrap();
    let (mut rng, mut outcomes, mut folded) = (StdRng::seed_from_u64(seed), Vec::new(), 0);
    // Half the runs as a rebuild's first: the emptied tables hold nothing, the fold reads
    // no version it did not write (until it forgets them).
    let mut folding = if rng.gen_bool(0.5) { Folding::from_nothing() } else { Folding::default() };
    let mut rest = stream;
    while !rest.is_empty() {
        let (batch, tail) = rest.split_at(rng.gen_range(1..=max_batch).min(rest.len()));
        let mut done = 0;
        while done < batch.len() {
            let mut prepared = projection.prepare(batch[done..].to_vec());
            let messages =
                batch[done..].iter().map(|raw| SourceMessage { payload: raw.to_json(), ..Default::default() });
            prepared.set_source(Source { messages: messages.collect(), ..Source::default() });
            prepared.set_checked(checked.clone());
            prepared.set_sole_writer();
            loop {
                if let Some(written) =
                    projectionist::postgres::folding::fold(&mut conn, projection, &prepared, &mut folding)
                        .await
                        .unwrap()
                {
                    assert_eq!(written.outcomes.len(), batch.len() - done, "a folded batch is folded whole");
                    (done, folded) = (batch.len(), folded + 1);
                    outcomes.extend(written.outcomes);
                    if rng.gen_bool(0.2) {
                        let mut tx = sqlx::Connection::begin(&mut *conn).await.unwrap();
                        projectionist::postgres::folding::write_folded(&mut tx, projection, &folding, None)
                            .await
                            .unwrap();
                        tx.commit().await.unwrap();
                        folding.written(false);
                    }
                    break;
                }
                let mut tx = sqlx::Connection::begin(&mut *conn).await.unwrap();
                projectionist::postgres::folding::write_folded(&mut tx, projection, &folding, Some(&prepared))
                    .await
                    .unwrap();
                match projectionist::postgres::writer::write(&mut tx, projection, &prepared, Mode::Batch, policy.on_gap)
                    .await
                {
                    Ok(written) => {
                        tx.commit().await.unwrap();
                        folding.written(true);
                        done += written.outcomes.len();
                        outcomes.extend(written.outcomes);
                        break;
                    }
                    Err(e) => {
                        tx.rollback().await.unwrap();
                        let index = e.event_index().unwrap_or_else(|| panic!("{}: {e}", projection.name()));
                        prepared.poison(index, e).unwrap();
                    }
                }
            }
        }
        rest = tail;
    }
    let mut tx = sqlx::Connection::begin(&mut *conn).await.unwrap();
    projectionist::postgres::folding::write_folded(&mut tx, projection, &folding, None).await.unwrap();
    tx.commit().await.unwrap();
    // As a rebuild does once its tables have grown.
    projectionist::postgres::analyze(&mut conn, projection).await.unwrap();
    (outcomes, dump_tables(pool, projection).await, folded)
}

/// The dead letters of `projection`: aggregate, version and reason, in order.
pub async fn dead_lettered(pool: &PgPool, projection: &str) -> Vec<(String, String, i64, String)> {
    sqlx::query_as(
        "SELECT aggregate_type, aggregate_id, version, reason FROM projectionist_dead_letters WHERE projection = $1 \
         ORDER BY 1, 2, 3, 4",
    )
    .bind(projection)
    .fetch_all(pool)
    .await
    .unwrap()
}

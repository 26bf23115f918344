//! `rebuild --aggregate TYPE ID`: a few aggregates' rows repaired beside the live run; and
//! the repair command `rebuild --verify` suggests for the rows it finds wrong.

use std::process::ExitCode;
use std::time::Instant;

use projectionist_core::Gate;
use projectionist_kafka::repair::{self, Partitions, Repaired, Repairing};
use projectionist_kafka::{EngineConfig, Registration};
use projectionist_postgres::rebuild::Difference;
use projectionist_postgres::{PgPool, PgProjection};

use crate::args::RebuildArgs;
use crate::run::Signals;

/// Repairs the aggregates of `args` in each selected projection, one after the other.
pub(crate) async fn repair_each(
    pool: &PgPool,
    config: EngineConfig,
    selected: Vec<Registration>,
    args: &RebuildArgs,
) -> anyhow::Result<ExitCode> {
    let aggregates: Vec<(String, String)> =
        args.aggregate.chunks(2).map(|pair| (pair[0].clone(), pair.get(1).cloned().unwrap_or_default())).collect();
    let read = if args.all_partitions { Partitions::All } else { Partitions::OfTheirKeys };
    for r in selected {
        let name = r.projection.name().to_owned();
        let mut config = config.for_projection(&name);
        // Its dead letters were produced to the topic when first met.
        config.dead_letter_topic = None;
        let started = Instant::now();
        let stop = Signals::listen()?.received();
        let repaired = repair::repair(pool, config, r.projection, r.topics, aggregates.clone(), read, stop).await?;
        match repaired {
            Repairing::Repaired { aggregates, partitions } => {
                let read = partitions.iter().map(|(t, p)| format!("{t}/{p}")).collect::<Vec<_>>().join(", ");
                let took = started.elapsed().as_secs_f64();
                println!("{name}: read {read} in {took:.1}s.");
                for repaired in &aggregates {
                    println!("  {}", said(repaired));
                }
            }
            Repairing::Stopped => {
                println!("{name}: stopped before its rows were put in place; the live tables are untouched.");
                return Ok(ExitCode::from(130));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// What a repair did for one aggregate, in a line.
fn said(r: &Repaired) -> String {
    let (aggregate_type, id) = &r.aggregate;
    match (r.version, r.removed) {
        (Some(version), removed) => format!(
            "{aggregate_type}/{id}: repaired to version {version} ({removed} live row(s) replaced by {} derived).",
            r.written
        ),
        (None, 0) => format!("{aggregate_type}/{id}: no event of it on the partitions read; nothing to repair."),
        (None, removed) => {
            format!("{aggregate_type}/{id}: no event of it on the partitions read; {removed} live row(s) removed.")
        }
    }
}

/// After a verification that found rows differ: the command that repairs the aggregates of
/// the first differing rows shown, when the projection can be repaired aggregate by aggregate.
pub(crate) fn print_repair_command(projection: &dyn PgProjection, differences: &[Difference]) {
    let aggregates = aggregates_of(projection, differences);
    if aggregates.is_empty() || !repair::unrepairable(projection).is_empty() {
        return;
    }
    let program = std::env::args().next().map(|p| p.rsplit('/').next().unwrap_or("").to_owned()).unwrap_or_default();
    let rebuild = format!("{program} rebuild --projection {}", shell_word(projection.name()));
    let mut command = format!("{rebuild} --abandon && {rebuild}");
    for (aggregate_type, id) in &aggregates {
        command.push_str(&format!(" --aggregate {} {}", shell_word(aggregate_type), shell_word(id)));
    }
    println!("Or drop them and repair only the aggregates of the rows shown, beside the live run:\n  {command}");
}

/// The aggregates of the differing rows shown (in order, once each): a table of one row per
/// aggregate or of child rows names its aggregate by its key, of the one type it declares;
/// the aggregate versions name theirs.
fn aggregates_of(projection: &dyn PgProjection, differences: &[Difference]) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for d in differences {
        let text = |v: &serde_json::Value| v.as_str().map(str::to_owned);
        let found: Vec<(String, String)> = if d.table == "projectionist_aggregate_versions" {
            d.first.iter().filter_map(|(key, ..)| Some((text(&key[0])?, text(&key[1])?))).collect()
        } else {
            let Some(table) = projection.tables().iter().find(|t| t.name() == d.table) else { continue };
            let [aggregate_type] = table.aggregate_types_declared() else { continue };
            if !matches!(table.gate(), Gate::Upsert | Gate::Transition | Gate::Child) {
                continue;
            }
            d.first.iter().filter_map(|(key, ..)| Some(((*aggregate_type).to_owned(), text(&key[0])?))).collect()
        };
        for aggregate in found {
            if !out.contains(&aggregate) {
                out.push(aggregate);
            }
        }
    }
    out
}

/// `word` as one word of a POSIX shell command line: as it is when it is plain, else quoted.
fn shell_word(word: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "-_./:@%+=,".contains(c);
    if !word.is_empty() && word.chars().all(plain) {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::shell_word;

    #[test]
    fn a_word_is_quoted_only_when_a_shell_would_split_or_expand_it() {
        assert_eq!(shell_word("acc-42"), "acc-42");
        assert_eq!(shell_word("a b"), "'a b'");
        assert_eq!(shell_word("it's"), r"'it'\''s'");
        assert_eq!(shell_word("$(rm)"), "'$(rm)'");
        assert_eq!(shell_word(""), "''");
    }
}

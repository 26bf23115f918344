//! The write model where PostgreSQL checks more than the declared types say: a NOT NULL
//! column without a default, `numeric(p, s)` (overflow and rounding at each step), the text
//! forms of `uuid`, `inet`, `date` and `time` PostgreSQL takes or refuses, a unique index and a
//! foreign key added by `schema()`, and a fan-in table written by two aggregate types. On
//! random streams with every delivery anomaly, applied set-based in random batches, one event
//! at a time and folded as a rebuild folds, the tables and the dead letters are the same.

mod common;

use std::collections::HashMap;

use common::{run, run_folded};
use projectionist::postgres::{migrate, Mode, PgConnection, PgProjection, Policy};
use projectionist::{Envelope, Projection, RawEnvelope, Table, Writes};
use projectionist_testing::{envelope, interleave, with_redeliveries};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

const ACCOUNT: &str = "acct";
const CARD: &str = "card";

#[derive(Serialize, Deserialize, Clone, Debug)]
#[serde(tag = "type", content = "data")]
enum Ev {
    /// Opens an account, with or without its NOT NULL `x`.
    Opened {
        owner: String,
        x: Option<String>,
    },
    Renamed {
        x: String,
    },
    /// Moves `d` (`numeric(4,2)`, at most 99.99) and the day's fan-in amount.
    Moved {
        d: f64,
    },
    Email {
        email: String,
    },
    Tagged {
        u: String,
        on: String,
        at: String,
    },
    /// A card of an account (an upsert; a foreign key to the account where linked).
    Issued {
        account: String,
        addr: String,
    },
}

/// One shape of the projection: `linked` adds a unique index on the e-mail, a foreign key from
/// cards to accounts and the fan-in table (none of which a rebuild folds); the plain shape
/// folds.
struct Strict {
    name: &'static str,
    tables: &'static [Table],
    schema: &'static [&'static str],
}

const fn accounts(name: &'static str) -> Table {
    Table::transition(name, "id").aggregate_type(ACCOUNT).columns(&[
        ("owner", "text"),
        ("x", "text NOT NULL"),
        ("d", "numeric(4,2) NOT NULL DEFAULT 0"),
        ("email", "text"),
        ("u", "uuid"),
        ("on_day", "date"),
        ("at_time", "time"),
    ])
}

const fn cards(name: &'static str) -> Table {
    Table::upsert(name, "id").aggregate_type(CARD).columns(&[("account", "text"), ("addr", "inet")])
}

/// Keyed by two typed columns: the event's version (as a day number) and its type.
const DAILY: Table = Table::fan_in_keys("sm_daily", &[("day", "bigint"), ("kind", "text")])
    .aggregate_types(&[ACCOUNT, CARD])
    .columns(&[("n", "bigint NOT NULL DEFAULT 0"), ("amount", "numeric(5,2) NOT NULL DEFAULT 0")]);

const SHAPES: [Strict; 2] = [
    Strict {
        name: "strict_linked",
        tables: &[accounts("sm_accounts"), cards("sm_cards"), DAILY],
        schema: &[
            "CREATE UNIQUE INDEX IF NOT EXISTS sm_accounts_email ON sm_accounts (email)",
            "DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_constraint WHERE conname = 'sm_cards_account') THEN \
             ALTER TABLE sm_cards ADD CONSTRAINT sm_cards_account FOREIGN KEY (account) REFERENCES sm_accounts (id); \
             END IF; END $$",
        ],
    },
    Strict { name: "strict_plain", tables: &[accounts("sm_plain_accounts"), cards("sm_plain_cards")], schema: &[] },
];

impl Projection<PgConnection> for Strict {
    type Event = Ev;

    fn name(&self) -> &str {
        self.name
    }

    fn tables(&self) -> &[Table] {
        self.tables
    }

    fn schema(&self) -> &[&str] {
        self.schema
    }

    fn project(&self, e: &Envelope<Ev>) -> Writes {
        let (accounts, cards) = (self.tables[0], self.tables[1]);
        // A day's row, counted by each event; deleted by a rename (and made again by the next).
        let kind = if e.aggregate_type == ACCOUNT { "account" } else { "card" };
        let daily = self.tables.get(2).map(|t| match &e.event {
            Ev::Renamed { .. } => t.row_keys(e.version.to_string(), kind).delete(),
            _ => t.row_keys(e.version.to_string(), kind).add("n", 1),
        });
        let writes: Writes = match &e.event {
            Ev::Opened { owner, x } => match x {
                Some(x) => accounts.write(e).set("owner", owner).set("x", x),
                None => accounts.write(e).set("owner", owner),
            }
            .into(),
            Ev::Renamed { x } => accounts.write(e).set("x", x).into(),
            Ev::Moved { d } => {
                let moved = accounts.write(e).add("d", d);
                return match daily {
                    Some(daily) => Writes::from(moved).and(daily.add("amount", d)),
                    None => moved.into(),
                };
            }
            Ev::Email { email } => accounts.write(e).set("email", email).into(),
            Ev::Tagged { u, on, at } => accounts.write(e).set("u", u).set("on_day", on).set("at_time", at).into(),
            Ev::Issued { account, addr } => cards.write(e).set("account", account).set("addr", addr).into(),
        };
        match daily {
            Some(daily) => writes.and(daily),
            None => writes,
        }
    }
}

/// A random delivered stream of accounts and cards, values at the edges of what their columns
/// take, interleaved, duplicated, re-sent and sometimes replayed from the start.
fn random_stream(seed: u64) -> Vec<RawEnvelope> {
    let mut rng = StdRng::seed_from_u64(seed);
    let accounts = rng.gen_range(2..8);
    let pick = |rng: &mut StdRng, of: &[&str]| of[rng.gen_range(0..of.len())].to_owned();
    let mut per_aggregate = Vec::new();
    for a in 0..accounts {
        let id = format!("a{a}");
        let mut history = Vec::new();
        for v in 1..=rng.gen_range(1..12) {
            let event = match rng.gen_range(0..10) {
                _ if v == 1 => {
                    let x = rng.gen_bool(0.7).then(|| format!("x{a}"));
                    Ev::Opened { owner: format!("o{a}"), x }
                }
                0 => Ev::Renamed { x: format!("x{a}.{v}") },
                1..=4 => {
                    let d = pick(&mut rng, &["50", "60", "-60", "12.34", "0.005", "-0.015", "49.995", "0.125"]);
                    Ev::Moved { d: d.parse().unwrap() }
                }
                5 | 6 => Ev::Email { email: pick(&mut rng, &["ann@x", "bob@x", "cy@x"]) },
                _ => {
                    let u = pick(
                        &mut rng,
                        &[
                            "67e55044-10b1-426f-9247-bb680e5fe0c8",
                            "67E55044-10B1-426F-9247-BB680E5FE0C9",
                            "urn:uuid:67e55044-10b1-426f-9247-bb680e5fe0ca",
                            "{67e55044-10b1-426f-9247-bb680e5fe0cb}",
                            "67e5504410b1426f9247bb680e5fe0cc",
                            "67e55044",
                        ],
                    );
                    let on = pick(&mut rng, &["2026-11-26", "20261127", "Nov 28 2026", "2026-02-30", "soon"]);
                    let at = pick(&mut rng, &["12:30", "23:59:59.5", "allballs", "24:00", "25:00", "noon"]);
                    Ev::Tagged { u, on, at }
                }
            };
            history.push(envelope(ACCOUNT, &id, v, &event));
        }
        per_aggregate.push(history);
    }
    for c in 0..rng.gen_range(1..4) {
        let history = (1..=rng.gen_range(1..4))
            .map(|v| {
                let account = format!("a{}", rng.gen_range(0..accounts + 1));
                let addr = pick(&mut rng, &["10.0.0.1", "::1", "10.0.0.0/8", "10.0.0.1/33", "nowhere"]);
                envelope(CARD, &format!("c{c}"), v, &Ev::Issued { account, addr })
            })
            .collect();
        per_aggregate.push(history);
    }
    let mut stream = with_redeliveries(&interleave(per_aggregate, seed), 0.2, 0.1, seed + 1);
    if rng.gen_bool(0.3) {
        let again = stream.clone();
        stream.extend(again);
    }
    stream
}

/// The dead letters of `projection`, with the message PostgreSQL refused each with.
async fn refusals(pool: &PgPool, projection: &str) -> Vec<(String, String, i64, String)> {
    sqlx::query_as(
        "SELECT aggregate_type, aggregate_id, version, error FROM projectionist_dead_letters WHERE projection = $1 \
         ORDER BY 1, 2, 3",
    )
    .bind(projection)
    .fetch_all(pool)
    .await
    .unwrap()
}

/// Batched, folded and per-event runs end alike, and the streams met every refusal the
/// shapes are there for (so that a generator too narrow to find a difference fails).
#[sqlx::test(migrations = false)]
async fn batched_folded_and_per_event_agree_where_postgres_checks_more_than_types(pool: PgPool) {
    let projections: Vec<&dyn PgProjection> = SHAPES.iter().map(|s| s as &dyn PgProjection).collect();
    migrate(&pool, &projections).await.unwrap();
    let mut refused: HashMap<&str, String> = HashMap::new();
    for seed in 0..16 {
        let stream = random_stream(seed);
        for shape in &SHAPES {
            let policy = Policy::default();
            let (_, per_event) = run(&pool, shape, &stream, (Mode::PerEvent, policy), seed).await;
            let letters = refusals(&pool, shape.name).await;
            let (_, batched) = run(&pool, shape, &stream, (Mode::Batch, policy), seed + 100).await;
            assert_eq!(batched, per_event, "seed {seed}, {}: batched tables differ", shape.name);
            assert_eq!(refusals(&pool, shape.name).await, letters, "seed {seed}, {}: batched", shape.name);
            let (_, folded, _) = run_folded(&pool, shape, &stream, policy, (seed + 200, 40)).await;
            assert_eq!(folded, per_event, "seed {seed}, {}: folded tables differ", shape.name);
            assert_eq!(refusals(&pool, shape.name).await, letters, "seed {seed}, {}: folded", shape.name);
            for (_, _, _, error) in letters {
                refused.entry(shape.name).or_default().push_str(&error);
            }
        }
    }
    let all = |shape: &str, wanted: &[&str]| {
        for w in wanted {
            assert!(refused[shape].contains(w), "{shape}: no refusal for {w}");
        }
    };
    all("strict_plain", &["not-null", "numeric field overflow", "uuid", "inet", "date", "time"]);
    all("strict_linked", &["unique constraint", "foreign key constraint", "not-null", "numeric field overflow"]);
}

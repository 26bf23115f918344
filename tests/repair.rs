//! Repairing a few aggregates (`rebuild --aggregate`), against the broker at KAFKA_BROKERS and
//! a fresh database per test: their rows, child rows and aggregate versions derived again from
//! their events alone, the rest untouched; a projection with fan-in rows refused.

#[path = "common/kafka.rs"]
mod kafka;

use std::sync::Arc;
use std::time::Duration;

use kafka::{brokers, config, rand_test_topic, run};
use order_status::{OrderEvent, OrderStatus, ORDERS, ORDER_LINES};
use projectionist::kafka::repair::{repair, Partitions, Repairing};
use projectionist::kafka::{topics, Engine};
use projectionist::postgres::{migrate, PgConnection, PgProjection};
use projectionist::{Envelope, Projection, RawEnvelope, Table, Writes};
use rdkafka::config::ClientConfig;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use serde_json::Value;
use sqlx::PgPool;

/// Orders and their lines, without the fan-in totals: what a repair can derive.
struct OrdersAndLines;

impl Projection<PgConnection> for OrdersAndLines {
    type Event = OrderEvent;

    fn name(&self) -> &str {
        "orders_and_lines"
    }

    fn tables(&self) -> &[Table] {
        &[ORDERS, ORDER_LINES]
    }

    fn project(&self, env: &Envelope<OrderEvent>) -> Writes {
        let order = || ORDERS.write(env).set("updated_at", env.occurred_at);
        match &env.event {
            OrderEvent::OrderArchived {} => ORDERS.write(env).delete().and(ORDER_LINES.clear(env)),
            OrderEvent::OrderPlaced { customer_id, total_cents } => order()
                .set("customer_id", customer_id)
                .set("total_cents", total_cents)
                .set("paid_cents", 0)
                .set("status", "placed")
                .into(),
            OrderEvent::ItemAdded { sku, quantity } => order()
                .and(ORDER_LINES.child_row(env, sku).add("quantity", quantity).set("updated_at", env.occurred_at)),
            OrderEvent::ItemRemoved { sku } => order().and(ORDER_LINES.child_row(env, sku).delete()),
            OrderEvent::OrderPaid { amount_cents } => {
                order().add("paid_cents", amount_cents).set("status", "paid").into()
            }
            OrderEvent::OrderShipped {} => order().set("status", "shipped").into(),
            OrderEvent::OrderCancelled { .. } => order().set("status", "cancelled").and(ORDER_LINES.clear(env)),
        }
    }
}

/// Produces `events` keyed by their aggregate ids as Java clients partition them (murmur2),
/// to a topic of `partitions` partitions.
async fn produce_keyed(topic: &str, partitions: i32, events: &[RawEnvelope]) {
    topics::create_topics(&brokers(), &[topic], partitions, 1).await.unwrap();
    let producer: ThreadedProducer<DefaultProducerContext> =
        ClientConfig::new().set("bootstrap.servers", brokers()).set("partitioner", "murmur2_random").create().unwrap();
    for e in events {
        let payload = e.to_json();
        producer.send(BaseRecord::to(topic).key(&e.aggregate_id).payload(&payload)).map_err(|(e, _)| e).unwrap();
    }
    producer.flush(Duration::from_secs(10)).unwrap();
}

/// The projection's tables and its aggregate versions, as JSON.
async fn state(pool: &PgPool, projection: &dyn PgProjection) -> (Value, Value) {
    let versions: Value = sqlx::query_scalar(
        "SELECT coalesce(jsonb_agg(to_jsonb(v) ORDER BY aggregate_id), '[]') FROM projectionist_aggregate_versions v \
         WHERE projection = $1",
    )
    .bind(projection.name())
    .fetch_one(pool)
    .await
    .unwrap();
    (projectionist_testing::dump_tables(pool, projection).await, versions)
}

async fn repaired(pool: &PgPool, projection: Arc<dyn PgProjection>, topic: &str, ids: &[&str]) -> Repairing {
    let aggregates = ids.iter().map(|id| (order_status::AGGREGATE_TYPE.to_owned(), (*id).to_owned())).collect();
    let repairing = repair(
        pool,
        config(),
        projection,
        vec![topic.to_owned()],
        aggregates,
        Partitions::OfTheirKeys,
        std::future::pending(),
    );
    tokio::time::timeout(Duration::from_secs(90), repairing).await.expect("the repair ended").unwrap()
}

/// Two orders' rows go wrong by hand (a status changed, its lines removed; a line added, the
/// aggregate version moved): a repair of those two reads only the partitions their ids can be
/// on and puts every table and the aggregate versions back as the live run left them; a third
/// order changed by hand and not named stays as it was changed.
#[sqlx::test(migrations = false)]
async fn an_orders_rows_and_child_rows_are_derived_again_from_its_events_alone(pool: PgPool) {
    let projection: Arc<dyn PgProjection> = Arc::new(OrdersAndLines);
    migrate(&pool, &[projection.as_ref()]).await.unwrap();
    let topic = rand_test_topic("repair");
    let events = order_status::generate::stream(60, 5, 11);
    produce_keyed(&topic, 12, &events).await;
    let live = run(Engine::new(pool.clone(), config()).register(projection.clone(), [topic.clone()])).await;
    assert!(live.halts().is_empty(), "{:?}", live.halts());
    let after_live = state(&pool, projection.as_ref()).await;
    // Orders with lines, to break.
    let with_lines: Vec<String> = sqlx::query_scalar("SELECT DISTINCT order_id FROM order_lines ORDER BY 1 LIMIT 3")
        .fetch_all(&pool)
        .await
        .unwrap();
    let [a, b, untouched] = &with_lines[..] else { panic!("three orders with lines: {with_lines:?}") };
    for statement in [
        format!("UPDATE orders SET status = 'lost' WHERE order_id = '{a}'"),
        format!("DELETE FROM order_lines WHERE order_id = '{a}'"),
        format!("INSERT INTO order_lines (order_id, sku, quantity) VALUES ('{b}', 'bogus', 9)"),
        format!("UPDATE projectionist_aggregate_versions SET version = version - 1 WHERE aggregate_id = '{b}'"),
        format!("UPDATE orders SET paid_cents = paid_cents + 1 WHERE order_id = '{untouched}'"),
    ] {
        sqlx::raw_sql(&statement).execute(&pool).await.unwrap();
    }

    let Repairing::Repaired { aggregates, partitions } = repaired(&pool, projection.clone(), &topic, &[a, b]).await
    else {
        panic!("repaired")
    };
    assert!(partitions.len() < 12, "only the partitions their ids can be on: {partitions:?}");
    assert_eq!(aggregates.len(), 2);
    assert!(aggregates.iter().all(|r| r.version.is_some() && r.written > 0), "{aggregates:?}");
    sqlx::raw_sql(&format!("UPDATE orders SET paid_cents = paid_cents - 1 WHERE order_id = '{untouched}'"))
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(state(&pool, projection.as_ref()).await, after_live, "the repaired rows are the live run's");
    let shadows: i64 =
        sqlx::query_scalar("SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'projectionist_rebuild_%'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(shadows, 0, "the repair's shadow is dropped");
}

/// A projection with a fan-in table cannot be repaired aggregate by aggregate: refused,
/// naming the table, its tables untouched.
#[sqlx::test(migrations = false)]
async fn a_projection_with_fan_in_rows_is_refused_naming_them(pool: PgPool) {
    let projection: Arc<dyn PgProjection> = Arc::new(OrderStatus);
    migrate(&pool, &[projection.as_ref()]).await.unwrap();
    let topic = rand_test_topic("repair-fan-in");
    produce_keyed(&topic, 3, &order_status::generate::stream(5, 2, 3)).await;
    let aggregates = vec![(order_status::AGGREGATE_TYPE.to_owned(), "o-1".to_owned())];
    let refused = repair(&pool, config(), projection, vec![topic], aggregates, Partitions::All, std::future::pending())
        .await
        .expect_err("refused");
    let said = refused.to_string();
    assert!(said.contains("customer_order_stats") && said.contains("fan-in"), "{said}");
}

/// Orders whose events were all written to one partition each, whatever their keys (a topic
/// repartitioned, or another partitioner): read only from the partitions their ids can be on,
/// most of them are not found there, and the repair is refused before anything is put in
/// place, saying to read every partition; with every partition read, they are repaired.
#[sqlx::test(migrations = false)]
async fn events_on_other_partitions_than_their_keys_refuse_the_repair_until_every_partition_is_read(pool: PgPool) {
    let projection: Arc<dyn PgProjection> = Arc::new(OrdersAndLines);
    migrate(&pool, &[projection.as_ref()]).await.unwrap();
    let topic = rand_test_topic("repair-elsewhere");
    let ids: Vec<String> = (0..12).map(|i| format!("o-{i}")).collect();
    let mut messages = Vec::new();
    for (partition, id) in ids.iter().enumerate() {
        let placed = OrderEvent::OrderPlaced { customer_id: "c".into(), total_cents: 10 };
        for event in [
            order_status::generate::envelope(id, 1, &placed),
            order_status::generate::envelope(id, 2, &OrderEvent::OrderShipped {}),
        ] {
            messages.push((Some(partition as i32), Some(id.as_str()), Some(event.to_json())));
        }
    }
    kafka::produce_to(&topic, 12, &messages).await;
    run(Engine::new(pool.clone(), config()).register(projection.clone(), [topic.clone()])).await;
    let after_live = state(&pool, projection.as_ref()).await;
    sqlx::raw_sql("UPDATE orders SET status = 'lost'").execute(&pool).await.unwrap();
    let order = |id: &String| vec![(order_status::AGGREGATE_TYPE.to_owned(), id.clone())];
    let repairing = |aggregates, read| {
        repair(&pool, config(), projection.clone(), vec![topic.clone()], aggregates, read, std::future::pending())
    };
    // Each order alone: those whose partition is none their id can be on are refused.
    let mut refused = 0;
    for id in &ids {
        if let Err(e) = repairing(order(id), Partitions::OfTheirKeys).await {
            let said = e.to_string();
            assert!(said.contains("--all-partitions") && said.contains("stands at version 2 live"), "{said}");
            refused += 1;
        }
    }
    assert!(refused > 0, "at most 4 of 12 partitions are an id's: some orders are elsewhere");
    let lost: i64 =
        sqlx::query_scalar("SELECT count(*) FROM orders WHERE status = 'lost'").fetch_one(&pool).await.unwrap();
    assert_eq!(lost, refused, "nothing put in place for the refused ones");
    let aggregates = ids.iter().flat_map(order).collect();
    let Repairing::Repaired { partitions, .. } = repairing(aggregates, Partitions::All).await.unwrap() else {
        panic!("repaired")
    };
    assert_eq!(partitions.len(), 12);
    assert_eq!(state(&pool, projection.as_ref()).await, after_live);
}

/// An order's event that cannot be applied (its data does not decode) is dead-lettered by the
/// live run, and an operator discards it, so its later events apply. A repair of that order
/// meets the same dead letter: it discards it in its shadow too, as the live side did, and
/// derives the order to the live run's version (it would otherwise stop behind the letter,
/// older than the live rows, and refuse).
#[sqlx::test(migrations = false)]
async fn a_dead_letter_discarded_live_is_discarded_in_the_repair_too(pool: PgPool) {
    let projection: Arc<dyn PgProjection> = Arc::new(OrdersAndLines);
    migrate(&pool, &[projection.as_ref()]).await.unwrap();
    let topic = rand_test_topic("repair-discarded");
    let e = order_status::generate::envelope;
    let placed = OrderEvent::OrderPlaced { customer_id: "c".into(), total_cents: 10 };
    let mut poison = e("o-1", 2, &OrderEvent::OrderPaid { amount_cents: 10 });
    poison.data = serde_json::json!({ "amount_cents": "not a number" });
    let events = [
        e("o-1", 1, &placed),
        poison,
        e("o-1", 3, &OrderEvent::OrderShipped {}),
        e("o-1", 4, &OrderEvent::ItemAdded { sku: "s".into(), quantity: 2 }),
    ];
    produce_keyed(&topic, 3, &events).await;
    run(Engine::new(pool.clone(), config()).register(projection.clone(), [topic.clone()])).await;
    let letters = projectionist::postgres::park::dead_letters(&pool, None, false).await.unwrap();
    let [letter] = &letters[..] else { panic!("one dead letter: {letters:?}") };
    let discard = projectionist::postgres::park::Resolve::Discard { reason: "a bad payment".into() };
    projectionist::postgres::park::resolve(&pool, projection.as_ref(), letter.id, discard).await.unwrap();
    let after_live = state(&pool, projection.as_ref()).await;
    let status: String = sqlx::query_scalar("SELECT status FROM orders").fetch_one(&pool).await.unwrap();
    assert_eq!(status, "shipped", "the later events applied once the letter was discarded");
    sqlx::raw_sql("UPDATE orders SET status = 'lost'; DELETE FROM order_lines").execute(&pool).await.unwrap();

    let Repairing::Repaired { aggregates, .. } = repaired(&pool, projection.clone(), &topic, &["o-1"]).await else {
        panic!("repaired")
    };
    assert_eq!(aggregates[0].version, Some(4), "{aggregates:?}");
    assert_eq!(state(&pool, projection.as_ref()).await, after_live);
}

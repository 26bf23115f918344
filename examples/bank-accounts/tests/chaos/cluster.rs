//! The partition leader killed in a three-node KRaft cluster (`scripts/services.sh
//! --start-cluster`: node1, node2, node3, each broker and controller, the topic replicated
//! three times with two in sync): a member runs and a producer publishes while the leader of
//! a partition is SIGKILLed; another replica takes over, and the member must bring the read
//! model to the end of the stream without exiting. The killed node is started again, and the
//! cluster stopped at the end (all by their recorded pids).

use super::*;

/// The node (1 to 3) leading `partition` of `topic`.
fn leader(brokers: &str, topic: &str, partition: i32) -> i32 {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let consumer: BaseConsumer = ClientConfig::new().set("bootstrap.servers", brokers).create().unwrap();
    let metadata = consumer.fetch_metadata(Some(topic), Duration::from_secs(10)).expect("metadata");
    let partitions = metadata.topics()[0].partitions();
    partitions.iter().find(|p| p.id() == partition).expect("the partition").leader()
}

#[sqlx::test(migrations = false)]
#[ignore = "the full fault suite only (scripts/chaos.sh): three more JVMs"]
async fn the_partition_leader_killed_in_a_three_node_cluster(pool: PgPool) {
    let test = "the_partition_leader_killed_in_a_three_node_cluster";
    let Some(brokers) = common::cluster_brokers(test) else { return };
    let db = pool.connect_options().get_database().expect("test database").to_owned();
    let scene = Scene::at(&std::env::var("DATABASE_URL").unwrap(), &db, brokers, "chaos-leader-killed").await;
    let events = stream(if full() { 1_000 } else { 300 }, 38);
    let (first, rest) = events.split_at(events.len() / 3);
    scene.publish(first, Duration::ZERO).await.unwrap();
    let mut member = scene.run(None);
    scene.until_exact(&pool, &mut member, first, Duration::from_secs(60)).await;
    let away = Duration::from_secs(if full() { 30 } else { 8 });
    let publishing = scene.publish(rest, away * 3 / 4 / rest.len() as u32);
    let node = format!("node{}", leader(&scene.brokers, &scene.topic, 0));
    common::services(&["--kill-broker", &node]);
    let (published, recovery) = scene.recovered(&pool, &mut member, publishing, &events).await;
    assert!(member.try_wait().unwrap().is_none(), "the projector exited with {node} killed");
    assert_ne!(format!("node{}", leader(&scene.brokers, &scene.topic, 0)), node, "another replica leads");
    common::services(&["--start-broker", &node]);
    scene.stop(member).await;
    let done = format!("p0's leader {node} SIGKILLed; all published {:.1} s on", published.as_secs_f64());
    conclude(&pool, &scene, "the partition leader killed (3 nodes)", &done, recovery, &events, Expect::Exact).await;
    common::services(&["--stop-cluster"]);
}

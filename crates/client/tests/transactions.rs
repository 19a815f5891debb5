//! The transactional producer against a real `rill server`: commits and aborts read back
//! by the client's own read_committed and read_uncommitted consumers, fencing of an older
//! producer of the same `transactional.id`, and the calls refused outside a transaction.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test harness: a failure is a test failure

mod common;

use std::time::{Duration, Instant};

use common::RillServer;
use rill_client::{
    Admin, ClientConfig, Consumer, ConsumerConfig, Error, NewTopic, OffsetSpec, Producer,
    ProducerConfig, ProducerRecord, TopicPartition,
};
use rill_protocol::ErrorCode;

fn client(server: &RillServer) -> ClientConfig {
    ClientConfig::new(&server.addr).request_timeout(Duration::from_secs(10))
}

fn transactional(server: &RillServer, id: &str) -> Producer {
    Producer::new(ProducerConfig::new(client(server)).transactional_id(id)).unwrap()
}

/// Every value of `topic`'s `partitions` up to the end (the LSO for read_committed),
/// partition by partition.
async fn read_values(
    server: &RillServer,
    topic: &str,
    partitions: i32,
    read_committed: bool,
    expected: usize,
) -> Vec<Vec<String>> {
    let config = ConsumerConfig::new(client(server)).read_committed(read_committed);
    let mut consumer = Consumer::new(config).unwrap();
    let tps: Vec<TopicPartition> = (0..partitions)
        .map(|p| TopicPartition::new(topic, p))
        .collect();
    consumer.assign(&tps).unwrap();
    consumer.seek_to(&tps, OffsetSpec::Earliest).await.unwrap();
    let mut out = vec![Vec::new(); partitions as usize];
    let mut seen = 0;
    let deadline = Instant::now() + Duration::from_secs(30);
    // The expected count, then a quiet second to catch anything extra.
    let mut quiet_until = None;
    while Instant::now() < deadline {
        for r in consumer.poll(Duration::from_millis(200)).await.unwrap() {
            out[r.partition as usize].push(String::from_utf8(r.value.unwrap().to_vec()).unwrap());
            seen += 1;
        }
        if seen >= expected {
            let until = *quiet_until.get_or_insert_with(|| Instant::now() + Duration::from_secs(1));
            if Instant::now() > until {
                break;
            }
        }
    }
    consumer.close().await.unwrap();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn committed_and_aborted_transactions_as_each_isolation_level_reads_them() {
    let Some(server) = RillServer::start() else {
        return;
    };
    let topic = "txn-client";
    Admin::new(client(&server))
        .unwrap()
        .create_topics(&[NewTopic::new(topic, 2)])
        .await
        .unwrap();
    let producer = transactional(&server, "client-copier");
    producer.init_transactions().await.unwrap();
    let mut committed = vec![Vec::new(), Vec::new()];
    let mut everything = vec![Vec::new(), Vec::new()];
    for txn in 0..6 {
        producer.begin_transaction().unwrap();
        for i in 0..20 {
            let value = format!("{txn}-{i}");
            let partition = i % 2;
            let delivery = producer
                .send(ProducerRecord::new(topic, value.clone()).partition(partition))
                .await
                .unwrap();
            everything[partition as usize].push(value.clone());
            if txn % 3 != 1 {
                committed[partition as usize].push(value);
            }
            drop(delivery);
        }
        if txn % 3 == 1 {
            producer.abort_transaction().await.unwrap();
        } else {
            producer.commit_transaction().await.unwrap();
        }
    }
    // An empty transaction ends without asking the coordinator.
    producer.begin_transaction().unwrap();
    producer.commit_transaction().await.unwrap();
    producer.close().await.unwrap();

    assert_eq!(read_values(&server, topic, 2, true, 80).await, committed);
    assert_eq!(read_values(&server, topic, 2, false, 120).await, everything);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_producer_of_the_same_id_is_fenced() {
    let Some(server) = RillServer::start() else {
        return;
    };
    let topic = "txn-fenced";
    Admin::new(client(&server))
        .unwrap()
        .create_topics(&[NewTopic::new(topic, 1)])
        .await
        .unwrap();
    let older = transactional(&server, "client-zombie");
    older.init_transactions().await.unwrap();
    older.begin_transaction().unwrap();
    older
        .send_and_wait(ProducerRecord::new(topic, "before"))
        .await
        .unwrap();

    let newer = transactional(&server, "client-zombie");
    newer.init_transactions().await.unwrap();
    newer.begin_transaction().unwrap();
    newer
        .send_and_wait(ProducerRecord::new(topic, "newer"))
        .await
        .unwrap();
    newer.commit_transaction().await.unwrap();

    // The older one's next record goes to a partition its transaction had: the leader
    // knows the newer epoch from the abort marker and refuses it.
    let late = older
        .send(ProducerRecord::new(topic, "after"))
        .await
        .unwrap();
    let refused = late.await.unwrap_err();
    assert!(
        matches!(
            refused.code(),
            Some(ErrorCode::INVALID_PRODUCER_EPOCH | ErrorCode::PRODUCER_FENCED)
        ),
        "{refused}"
    );
    let commit = older.commit_transaction().await.unwrap_err();
    assert!(commit.code().is_some(), "{commit}");

    assert_eq!(
        read_values(&server, topic, 1, true, 1).await,
        vec![vec!["newer".to_string()]]
    );
    assert_eq!(
        read_values(&server, topic, 1, false, 2).await,
        vec![vec!["before".to_string(), "newer".to_string()]]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactional_calls_out_of_order_are_refused() {
    let Some(server) = RillServer::start() else {
        return;
    };
    let producer = transactional(&server, "client-order");
    assert!(matches!(
        producer.begin_transaction(),
        Err(Error::IllegalState(_))
    ));
    producer.init_transactions().await.unwrap();
    assert!(matches!(
        producer.send(ProducerRecord::new("anything", "v")).await,
        Err(Error::IllegalState(_))
    ));
    assert!(matches!(
        producer.commit_transaction().await,
        Err(Error::IllegalState(_))
    ));
    producer.begin_transaction().unwrap();
    assert!(matches!(
        producer.begin_transaction(),
        Err(Error::IllegalState(_))
    ));
    producer.abort_transaction().await.unwrap();

    // A producer without a transactional id has no transactions.
    let plain = Producer::new(ProducerConfig::new(client(&server))).unwrap();
    assert!(matches!(
        plain.init_transactions().await,
        Err(Error::IllegalState(_))
    ));
}

/// The cluster finalizes `transaction.version` 2, so the producer runs at transaction
/// version 2 (KIP-890 part 2): no AddPartitionsToTxn (the leaders add partitions on
/// Produce v12), and every commit or abort bumps the epoch, which the coordinator shows
/// and the next transaction's batches carry from sequence 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_transaction_version_2_every_transaction_ends_with_a_new_epoch() {
    let Some(server) = RillServer::start() else {
        return;
    };
    let topic = "txn-v2";
    let admin = Admin::new(client(&server)).unwrap();
    admin
        .create_topics(&[NewTopic::new(topic, 2)])
        .await
        .unwrap();
    let producer = transactional(&server, "client-v2");
    producer.init_transactions().await.unwrap();
    let epoch_now = || async {
        let d = admin
            .describe_transactions(&["client-v2".to_string()])
            .await
            .unwrap();
        (d[0].state.clone(), d[0].producer_epoch)
    };
    assert_eq!(epoch_now().await, ("Empty".to_string(), 0));
    let mut expected = Vec::new();
    for (round, commit) in [(0, true), (1, false), (2, true), (3, true)] {
        producer.begin_transaction().unwrap();
        for i in 0..20 {
            let value = format!("r{round}-{i}");
            producer
                .send(ProducerRecord::new(topic, value.clone()).partition(i % 2))
                .await
                .unwrap();
            if commit {
                expected.push(value);
            }
        }
        if commit {
            producer.commit_transaction().await.unwrap();
        } else {
            producer.abort_transaction().await.unwrap();
        }
        let (state, epoch) = epoch_now().await;
        assert_eq!(epoch, round + 1, "after round {round}");
        assert!(
            state.starts_with(if commit {
                "PrepareCommit"
            } else {
                "PrepareAbort"
            }) || state
                == if commit {
                    "CompleteCommit"
                } else {
                    "CompleteAbort"
                },
            "{state}"
        );
    }
    producer.close().await.unwrap();
    let mut seen: Vec<String> = read_values(&server, topic, 2, true, 60)
        .await
        .into_iter()
        .flatten()
        .collect();
    seen.sort();
    expected.sort();
    assert_eq!(seen, expected);
}

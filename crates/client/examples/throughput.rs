//! Produce then consume throughput against a running broker, for comparing with other
//! clients on the same broker and record size.
//!
//! ```text
//! cargo run --example throughput -p rill-client -- 127.0.0.1:9092 bench-topic 200000 1024
//! ```
//!
//! Creates the topic (one partition unless it exists), produces COUNT records of SIZE
//! bytes with the default producer (idempotent, acks=all, linger 5 ms, batch 16 KiB →
//! here 1 MiB, as benchmark runs usually set), then reads them all back by assignment.

use std::time::{Duration, Instant};

use rill_client::{
    Admin, ClientConfig, Consumer, ConsumerConfig, NewTopic, OffsetSpec, Producer, ProducerConfig,
    ProducerRecord, TopicPartition,
};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let bootstrap = args.get(1).map_or("127.0.0.1:9092", String::as_str);
    let topic = args.get(2).map_or("rill-throughput", String::as_str);
    let count: usize = args.get(3).map_or(Ok(100_000), |s| s.parse())?;
    let size: usize = args.get(4).map_or(Ok(1024), |s| s.parse())?;
    let batch_size: usize = args.get(5).map_or(Ok(1 << 20), |s| s.parse())?;
    let client = ClientConfig::new(bootstrap);
    let admin = Admin::new(client.clone())?;
    if let Err(e) = admin.create_topics(&[NewTopic::new(topic, 1)]).await {
        eprintln!("create topic: {e}");
    }

    let producer = Producer::new(
        ProducerConfig::new(client.clone())
            .linger(Duration::from_millis(5))
            .batch_size(batch_size),
    )?;
    let value = bytes::Bytes::from(vec![b'x'; size]);
    let started = Instant::now();
    for _ in 0..count {
        producer
            .send(ProducerRecord::new(topic, value.clone()))
            .await?;
    }
    producer.flush().await?;
    let secs = started.elapsed().as_secs_f64();
    producer.close().await?;
    println!(
        "produce: {count} records of {size} B in {secs:.2} s = {:.0} rec/s, {:.1} MiB/s",
        count as f64 / secs,
        (count * size) as f64 / secs / (1 << 20) as f64
    );

    let mut consumer = Consumer::new(ConsumerConfig::new(client))?;
    let tp = TopicPartition::new(topic, 0);
    consumer.assign(std::slice::from_ref(&tp))?;
    consumer
        .seek_to(std::slice::from_ref(&tp), OffsetSpec::Earliest)
        .await?;
    let started = Instant::now();
    let mut read = 0usize;
    while read < count {
        read += consumer.poll(Duration::from_secs(5)).await?.len();
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "consume: {read} records in {secs:.2} s = {:.0} rec/s, {:.1} MiB/s",
        read as f64 / secs,
        (read * size) as f64 / secs / (1 << 20) as f64
    );
    consumer.close().await?;
    Ok(())
}

//! strand-client inside a tokio service: its futures are plain futures,
//! resolved by the client's own I/O threads, so tokio just awaits them.
//!
//! ```sh
//! strand serve &
//! cargo run -p strand-client --example tokio
//! ```

use strand_client::*;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), ClientError> {
    let brokers = std::env::var("STRAND_BROKERS").unwrap_or_else(|_| "127.0.0.1:9400".into());
    let admin = Admin::connect(&brokers)?;
    match admin.create_queue("example-tokio", &QueueSpec::default()).await {
        Err(e) if e.code() == Some(strand_wire::ErrorCode::QueueAlreadyExists) => {}
        other => other?,
    }
    let producer = Producer::new(&brokers, ProducerConfig::default())?;
    // Many sends in flight from one task: enqueue all, then await the acks.
    let mut deliveries = Vec::new();
    for i in 0..1000 {
        let value = format!("event {i}");
        deliveries.push(producer.enqueue("example-tokio", None, value.as_bytes(), &[]).await?);
    }
    let mut last = None;
    for d in deliveries {
        last = d.await?.offset;
    }
    println!("1,000 events stored; the last at offset {last:?}");

    // Tasks can share the producer.
    let p = producer.clone();
    let task = tokio::spawn(async move { p.send("example-tokio", Some(b"k"), b"from a task", &[]).await });
    let delivered = task.await.map_err(|e| ClientError::Invalid(e.to_string()))??;
    println!("a spawned task's record went to partition {}", delivered.partition);
    Ok(())
}

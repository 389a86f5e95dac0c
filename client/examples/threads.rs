//! strand-client from plain threads, no async runtime: `block_on` waits for
//! each future.
//!
//! ```sh
//! strand serve &                      # a broker on 127.0.0.1:9400
//! cargo run -p strand-client --example threads
//! ```

use std::time::Duration;

use strand_client::*;

fn main() -> Result<(), ClientError> {
    let brokers = std::env::var("STRAND_BROKERS").unwrap_or_else(|_| "127.0.0.1:9400".into());
    let admin = Admin::connect(&brokers)?;
    match block_on(admin.create_queue(
        "example-threads",
        &QueueSpec {
            partitions: Some(3),
            ..QueueSpec::default()
        },
    )) {
        Err(e) if e.code() == Some(strand_wire::ErrorCode::QueueAlreadyExists) => {}
        other => other?,
    }

    // Four threads share one producer (it is Clone + Send + Sync).
    let producer = Producer::new(&brokers, ProducerConfig::default())?;
    let senders: Vec<_> = (0..4)
        .map(|t| {
            let producer = producer.clone();
            std::thread::spawn(move || -> Result<(), ClientError> {
                for i in 0..100 {
                    let key = format!("thread-{t}");
                    let value = format!("message {i} from {key}");
                    block_on(producer.send("example-threads", Some(key.as_bytes()), value.as_bytes(), &[]))?;
                }
                Ok(())
            })
        })
        .collect();
    for s in senders {
        s.join()
            .map_err(|_| ClientError::Invalid("a sender thread panicked".into()))??;
    }

    let mut consumer = Consumer::new(
        &brokers,
        ConsumerConfig {
            start: Seek::Earliest,
            max_wait: Duration::from_millis(200),
            ..ConsumerConfig::default()
        },
    )?;
    block_on(consumer.assign_all("example-threads"))?;
    let mut seen = 0;
    while seen < 400 {
        let records = block_on(consumer.poll())?;
        if records.is_empty() {
            break;
        }
        seen += records.len();
    }
    println!("produced 400, read back {seen} (more if the example ran before)");
    Ok(())
}

//! strand-client inside a glommio executor (a thread-per-core service that
//! is itself a Strand client): the client's futures do no I/O on the
//! executor — its own threads do — so awaiting them never blocks the ring.
//!
//! ```sh
//! strand serve &
//! cargo run -p strand-client --example glommio
//! ```

use std::time::Duration;

use glommio::LocalExecutorBuilder;
use strand_client::*;

fn main() -> Result<(), ClientError> {
    let brokers = std::env::var("STRAND_BROKERS").unwrap_or_else(|_| "127.0.0.1:9400".into());
    let run = LocalExecutorBuilder::default()
        .name("example")
        .spawn(move || async move {
            let admin = Admin::connect(&brokers)?;
            match admin.create_queue("example-glommio", &QueueSpec::default()).await {
                Err(e) if e.code() == Some(strand_wire::ErrorCode::QueueAlreadyExists) => {}
                other => other?,
            }
            let producer = Producer::new(
                &brokers,
                ProducerConfig {
                    linger: Duration::from_millis(1),
                    ..ProducerConfig::default()
                },
            )?;
            let d = producer
                .send("example-glommio", Some(b"sensor-1"), b"21.5C", &[])
                .await?;
            println!("stored at partition {} offset {:?}", d.partition, d.offset);

            let mut consumer = Consumer::new(
                &brokers,
                ConsumerConfig {
                    start: Seek::Offset(d.offset.unwrap_or(0)),
                    ..ConsumerConfig::default()
                },
            )?;
            consumer.assign("example-glommio", &[d.partition]);
            let records = consumer.poll().await?;
            println!("read back {} record(s)", records.len());
            Ok::<(), ClientError>(())
        })
        .map_err(|e| ClientError::Invalid(format!("cannot start the executor: {e}")))?;
    run.join()
        .map_err(|e| ClientError::Invalid(format!("the executor failed: {e}")))?
}

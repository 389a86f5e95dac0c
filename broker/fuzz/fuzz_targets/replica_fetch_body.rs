//! A ReplicaFetch body through the handler's parse.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    strand_broker::fuzzing::replica_fetch_body(data);
});

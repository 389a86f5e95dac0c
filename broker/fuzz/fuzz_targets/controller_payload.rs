//! A controller RPC payload, decoded as each payload the controller
//! reads, and applied when it is a command.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    strand_broker::fuzzing::controller_payload(data);
});

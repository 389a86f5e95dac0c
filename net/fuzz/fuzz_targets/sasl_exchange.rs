//! Both sides of a SCRAM exchange fed arbitrary messages.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    strand_net::fuzzing::sasl_exchange(data);
});

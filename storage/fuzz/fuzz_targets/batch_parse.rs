//! Batch parsing: validation, record iteration and stamping never panic, and
//! what validates iterates consistently.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    strand_storage::fuzzing::batch_parse(data);
});

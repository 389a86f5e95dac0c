//! The recovery scan over an arbitrary segment image: never panics, and the
//! batches it accepts are contiguous, valid and end where it says.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    strand_storage::fuzzing::recovery_scan(data);
});

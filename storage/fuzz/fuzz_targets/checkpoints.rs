//! The leader-epoch, high-watermark and producer-snapshot files: decoding never
//! panics, and what decodes encodes back to the same bytes.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    strand_storage::fuzzing::checkpoints(data);
});

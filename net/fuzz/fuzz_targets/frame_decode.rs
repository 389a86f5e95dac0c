//! Frame decoding and body verification over arbitrary streams.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    strand_net::fuzzing::frame_decode(data);
});

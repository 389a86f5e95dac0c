//! A journal file image: the scan never panics, what it accepts encodes
//! back to the same bytes, and planning a replay over it never panics.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    strand_storage::fuzzing::journal_file(data);
});

#![no_main]
// See src/fuzzing.rs for what this target checks.
libfuzzer_sys::fuzz_target!(|data: &[u8]| turnstile::fuzzing::one_reading(data));

#![no_main]
// See module/src/fuzzing.rs for what this target checks.
libfuzzer_sys::fuzz_target!(|data: &[u8]| turnstile_module::fuzzing::module_args(data));

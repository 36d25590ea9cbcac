#![no_main]
// Checks: compiler_collectives_fuzz_checks::slot_decode.
libfuzzer_sys::fuzz_target!(|data: &[u8]| compiler_collectives_fuzz_checks::slot_decode(data));

#![no_main]
// Checks: compiler_collectives_fuzz_checks::scenario_parse.
libfuzzer_sys::fuzz_target!(|data: &[u8]| compiler_collectives_fuzz_checks::scenario_parse(data));

#![no_main]
// Checks: compiler_collectives_fuzz_checks::tcpstore_reply_decode.
libfuzzer_sys::fuzz_target!(
    |data: &[u8]| compiler_collectives_fuzz_checks::tcpstore_reply_decode(data)
);

#![no_main]
//! libFuzzer entry for `ginx::fuzz::control_request` (the invariants are there).
libfuzzer_sys::fuzz_target!(|data: &[u8]| ginx::fuzz::control_request(data));

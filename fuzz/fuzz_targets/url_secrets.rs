#![no_main]
//! libFuzzer entry for `ginx::fuzz::url_secrets` (the invariants are there).
libfuzzer_sys::fuzz_target!(|data: &[u8]| ginx::fuzz::url_secrets(data));

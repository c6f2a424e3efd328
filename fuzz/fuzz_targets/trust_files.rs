#![no_main]
//! libFuzzer entry for `ginx::fuzz::trust_files` (the invariants are there).
libfuzzer_sys::fuzz_target!(|data: &[u8]| ginx::fuzz::trust_files(data));

#![no_main]
//! libFuzzer entry for `ginx::fuzz::renderers` (the invariants are there).
libfuzzer_sys::fuzz_target!(|data: &[u8]| ginx::fuzz::renderers(data));

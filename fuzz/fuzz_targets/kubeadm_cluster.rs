#![no_main]
//! libFuzzer entry for `ginx::fuzz::kubeadm_cluster` (the invariants are there).
libfuzzer_sys::fuzz_target!(|data: &[u8]| ginx::fuzz::kubeadm_cluster(data));

//! Integration tests: the real `ginx` and `ginxctl` binaries, in temporary directories, against
//! real Git repositories and servers on 127.0.0.1 and a stand-in colmena.

mod support;

mod alert_gate;
mod apply_engine;
mod bootstrap;
mod canaries;
mod closure;
mod cluster_api;
mod control_socket;
mod core_loop;
mod docs;
mod etcd;
mod events;
mod faults;
mod faults_etcd;
mod fleet;
mod fleetlock;
mod freezes;
mod holds;
mod kubeadm;
mod kubernetes;
mod last_look;
mod monitoring;
mod notify;
mod packaging;
mod privilege;
mod qemu;
mod reboot;
mod rollout;
mod soak;
mod sources;
mod systemd;
mod throughput;

//! The shaper controller as a library: the CLI binary, the integration tests
//! and the benchmarks all drive the same code.
//!
//! Data path, top to bottom: `cli` (or `config_file`) → `config` (validated) → `checks`
//! (nothing changed yet) → `attach` and `ingress` (qdisc snapshot, sch_fq,
//! the classifiers at their `hook`s, `pins`; `nat` on the LAN side) → `status` (`counters`) →
//! `undo`, on exit or from `cleanup` (restore exactly).

pub mod attach;
pub mod bench;
pub mod bpf;
pub mod btf;
pub mod checks;
pub mod cli;
pub mod commands;
pub mod config;
pub mod config_file;
pub mod counters;
pub mod duration;
pub mod gso;
pub mod hook;
pub mod ifb;
pub mod ingress;
pub mod lab;
pub mod link;
pub mod nat;
pub mod observe;
pub mod pacer;
pub mod pins;
pub mod rate;
pub mod sim;
pub mod state;
pub mod status;
pub mod tc;
pub mod telemetry;
pub mod tin_status;
pub mod trace;
pub mod undo;
pub mod watch;

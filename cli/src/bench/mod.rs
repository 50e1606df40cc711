//! The benchmarks: one module per `tiercache bench` command (`run` is `tiercache bench`
//! itself, the workload matrix), over a shared [`kit`] (fio, child processes, the daemon as a
//! child, report writing, host information, summaries of rounds).
//!
//! `bench --study ceph-osd` (`crate::bench_osd`) and the Ceph cluster the benches start
//! (`crate::bench_ceph`) live beside this folder and use the same kit.

pub(crate) mod core;
pub(crate) mod engine;
pub(crate) mod kit;
pub(crate) mod load;
pub(crate) mod peers;
pub(crate) mod run;
pub(crate) mod studies;
pub(crate) mod waiters;
pub(crate) mod wbhits;
pub(crate) mod wl;

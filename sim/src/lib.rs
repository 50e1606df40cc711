//! tiercache's simulator: the real, unchanged cache core ([`tiercache_core::Cache`]) driven by
//! simulated clients and devices on a simulated clock.
//!
//! | module | what it is |
//! |---|---|
//! | [`device`] | device models (HDD, flash, RAM) with shipped presets: the `tiercache-devmodel` crate, re-exported |
//! | [`engine`] | the discrete-event engine: clients, servers, caches, devices |
//! | [`mrc`] | miss-ratio curves: LRU stack distances (exact or SHARDS) and the real core per size |
//! | [`osd_study`] | the scenario of `bench --study ceph-osd`, built from its parameters and calibration |
//! | [`scenario`] | scenario files: topology, cache, configs, workloads |
//! | [`stats`] | latency histograms and time series |
//! | [`rng`] | the deterministic PRNG and Zipf generator |
//! | [`trace`] | block trace readers: the formats people have, per device, sorted |
//! | [`workload`] | client workloads: patterns, distributions, trace replay |

pub mod engine;
pub mod mrc;
pub mod osd_study;
pub mod rng;
pub mod scenario;
pub mod stats;
pub mod trace;
pub mod workload;

pub use tiercache_devmodel as device;

//! # tiercache-core: the pure cache core
//!
//! Everything tiercache does to data is decided here, and nothing here does IO, reads a clock,
//! spawns a thread or copies a byte. The core is a state machine: the engine (real devices) or
//! the simulator (device models) feeds it [`event::Event`]s with the current time, and it answers
//! with [`event::Action`]s: device reads, writes, flushes, buffer copies, request completions.
//! See `docs/ARCHITECTURE.md` for the whole picture and `docs/SAFETY.md` for the durability
//! contract this crate implements.
//!
//! Crate map:
//! - [`units`]: block addresses, ids, time, line sizes, block masks.
//! - [`event`]: events in, actions out.
//! - [`lists`]: the shared intrusive lists eviction and cleaning keep lines on.
//! - [`cache`]: the state machine ([`cache::Cache::apply`]).
//! - [`map`], [`state`]: the mapping and per-line valid/dirty state.
//! - [`mode`]: the cache modes as rules.
//! - [`policy`]: eviction, promotion, sequential cutoff, IO classes, cleaning, rate control.

pub mod cache;
pub mod config;
pub mod event;
pub mod hash;
mod hint;
pub mod lists;
pub mod machine;
pub mod map;
pub mod mode;
pub mod policy;
pub mod state;
pub mod stats;
pub mod units;
pub mod wl;

pub use cache::Cache;
pub use config::Config;
pub use event::{Action, BufRef, Dev, Event, IoError, ReqError};
pub use machine::Machine;
pub use mode::CacheMode;

//! Device models: what a submitted IO costs in simulated time.
//!
//! Two users share these models: the simulator (`tiercache-sim`, which re-exports this crate as
//! `tiercache_sim::device`) runs them on its simulated clock, and the `io` crate's `emu:PRESET:PATH`
//! backend applies them in real time. The crate depends only on the core's units.
//!
//! A model is a deterministic state machine over simulated time. The simulator submits IOs with
//! [`Device::submit`], asks when the next one completes with [`Device::next_completion`], and
//! collects completions with [`Device::complete_until`]. A model never reads a clock and never
//! uses randomness it was not seeded with, so a run replays exactly.
//!
//! Models are described by [`DeviceSpec`] (TOML); shipped presets live in `presets/*.toml` and
//! each says where its numbers come from.

pub mod flash;
pub mod hdd;

use serde::{Deserialize, Serialize};
use tiercache_core::units::Nanos;

/// Bytes per block: device addresses are in 512-byte blocks throughout tiercache.
pub const BLOCK: u64 = 512;

/// What an IO does.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum IoKind {
    /// Read.
    Read,
    /// Write (`fua`: forced to media before completion).
    Write {
        /// Force unit access.
        fua: bool,
    },
    /// Flush the device's volatile write cache.
    Flush,
    /// Discard / write zeroes: metadata-only on the models here.
    Trim,
}

/// One IO submitted to a device model.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct DevIo {
    /// The submitter's handle, returned on completion.
    pub token: u64,
    /// What it does.
    pub kind: IoKind,
    /// First block (512 B).
    pub lba: u64,
    /// Blocks (0 for a flush).
    pub blocks: u32,
}

/// A device model.
pub trait Device: Send {
    /// The preset or model name.
    fn name(&self) -> &str;
    /// Capacity in 512-byte blocks.
    fn capacity_blocks(&self) -> u64;
    /// Accepts an IO at `now` (never earlier than the previous call's `now`).
    fn submit(&mut self, now: Nanos, io: DevIo);
    /// When the earliest outstanding IO completes, if any is outstanding.
    fn next_completion(&self) -> Option<Nanos>;
    /// Appends to `done` the tokens of every IO that completes at or before `now`, in
    /// completion order, and advances the model to `now`.
    fn complete_until(&mut self, now: Nanos, done: &mut Vec<u64>);
    /// IOs submitted and not yet completed.
    fn outstanding(&self) -> usize;
}

/// A device description, as found in a preset or a scenario file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "model", rename_all = "lowercase", deny_unknown_fields)]
pub enum DeviceSpec {
    /// A hard disk with one actuator.
    Hdd(hdd::HddSpec),
    /// Flash or RAM: parallel channels with fixed latencies and bandwidth limits.
    Flash(flash::FlashSpec),
}

impl DeviceSpec {
    /// Builds a model of `capacity_blocks` (0: the spec's own capacity).
    pub fn build(&self, capacity_blocks: u64) -> Box<dyn Device> {
        match self {
            DeviceSpec::Hdd(s) => Box::new(hdd::Hdd::new(s.clone(), capacity_blocks)),
            DeviceSpec::Flash(s) => Box::new(flash::Flash::new(s.clone(), capacity_blocks)),
        }
    }
}

/// A shipped preset: name, source note, TOML text.
pub struct Preset {
    /// Name used on the command line and in scenario files.
    pub name: &'static str,
    /// The preset file's text.
    pub toml: &'static str,
}

/// Every shipped preset.
pub const PRESETS: &[Preset] = &[
    Preset {
        name: "hdd-10k-sas",
        toml: include_str!("../presets/hdd-10k-sas.toml"),
    },
    Preset {
        name: "hdd-7k2-sata",
        toml: include_str!("../presets/hdd-7k2-sata.toml"),
    },
    Preset {
        name: "nvme-p4510",
        toml: include_str!("../presets/nvme-p4510.toml"),
    },
    Preset {
        name: "optane-p4800x",
        toml: include_str!("../presets/optane-p4800x.toml"),
    },
    Preset {
        name: "sata-ssd",
        toml: include_str!("../presets/sata-ssd.toml"),
    },
    Preset {
        name: "ram",
        toml: include_str!("../presets/ram.toml"),
    },
];

/// A preset's spec by name, or a device TOML file by path (a name ending in `.toml`).
pub fn preset(name: &str) -> Result<DeviceSpec, String> {
    if let Some(p) = PRESETS.iter().find(|p| p.name == name) {
        return parse_spec(p.toml).map_err(|e| format!("preset {name}: {e}"));
    }
    if name.ends_with(".toml") {
        let text = std::fs::read_to_string(name).map_err(|e| format!("cannot read {name}: {e}"))?;
        return parse_spec(&text).map_err(|e| format!("{name}: {e}"));
    }
    let names: Vec<&str> = PRESETS.iter().map(|p| p.name).collect();
    Err(format!(
        "unknown device preset '{name}' (known: {}; or a path to a .toml file)",
        names.join(", ")
    ))
}

/// Parses a device spec from TOML text.
pub fn parse_spec(text: &str) -> Result<DeviceSpec, String> {
    toml::from_str(text).map_err(|e| e.to_string())
}

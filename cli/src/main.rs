//! `tiercache`: the one command-line tool of tiercache (SPEC "CLI").
//!
//! Verbs are added as the capabilities behind them land; each verb lives in its own module.
//! Errors: one line on stderr saying what was wrong and what to do, exit status 1.

mod alloc_count;
mod bench_core;
mod bench_engine;
mod inspect;
mod sim_cmd;

use clap::{Parser, Subcommand};

#[global_allocator]
static ALLOC: alloc_count::Counting = alloc_count::Counting;

/// tiercache: a userspace block cache (fast media in front of HDDs, image files and Ceph RBD).
#[derive(Parser)]
#[command(name = "tiercache", version, about)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Benchmarks.
    Bench {
        #[command(subcommand)]
        what: BenchCmd,
    },
    /// Simulate a scenario: the real cache core against modelled devices and clients.
    Sim(sim_cmd::Args),
    /// Show what a cache device holds (offline, read-only).
    Inspect(inspect::InspectArgs),
    /// Verify every checksum and cross-reference of a cache device (offline, read-only).
    Check(inspect::CheckArgs),
}

#[derive(Subcommand)]
enum BenchCmd {
    /// Cache-core micro-benchmark: decision time per hit and metadata RAM per line.
    Core(bench_core::Args),
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.cmd {
        Cmd::Bench {
            what: BenchCmd::Core(args),
        } => bench_core::run(args),
        Cmd::Sim(args) => sim_cmd::run(args),
        Cmd::Inspect(args) => inspect::inspect(args),
        Cmd::Check(args) => inspect::check(args),
    };
    if let Err(e) = result {
        eprintln!("tiercache: {e}");
        std::process::exit(1);
    }
}

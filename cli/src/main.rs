//! `tiercache`: the one command-line tool of tiercache (SPEC "CLI").
//!
//! Verbs are added as the capabilities behind them land; each verb lives in its own module.
//! Errors: one line on stderr saying what was wrong and what to do, exit status 1 (2 for a
//! wrong command line; `check` has its own statuses, `inspect::CHECK_EXIT`).

mod admin_cmds;
mod alloc_count;
mod bench;
mod bench_ceph;
mod bench_osd;
mod choices;
mod inspect;
mod params;
mod shell;
mod sim_cmd;
mod sim_mrc;
mod svg;

use clap::{FromArgMatches, Parser, Subcommand};

#[global_allocator]
static ALLOC: alloc_count::Counting = alloc_count::Counting;

/// A userspace block cache: fast media (NVMe, RAM) in front of HDDs, image files and Ceph RBD.
///
/// A daemon serves cached volumes (a core device behind a cache device) as NBD exports; this
/// tool runs it, manages caches and cores through it, and inspects cache devices offline.
#[derive(Parser)]
#[command(name = "tiercache", version = shell::VERSION)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

// Parsed once per run: the size of the bench variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Cmd {
    /// Benchmark: the studies' workload matrix, baseline vs cached, over NBD (`--quick`: the
    /// embedded default); `bench core` and `bench load` are micro-benchmarks.
    #[command(args_conflicts_with_subcommands = true)]
    Bench {
        #[command(subcommand)]
        what: Option<BenchCmd>,
        #[command(flatten)]
        args: bench::run::Args,
    },
    /// Simulate a scenario: the real cache core against modelled devices and clients;
    /// `sim mrc` draws a trace's miss-ratio curve, `sim devices` lists a trace's devices.
    #[command(args_conflicts_with_subcommands = true)]
    Sim {
        #[command(subcommand)]
        what: Option<SimCmd>,
        #[command(flatten)]
        args: sim_cmd::Args,
    },
    /// Show what a cache device holds (offline, read-only).
    Inspect(inspect::InspectArgs),
    /// Verify every checksum and cross-reference of a cache device (offline, read-only); exit
    /// status 0 loads, 1 damaged, 2 usage, 3 cannot open.
    Check(inspect::CheckArgs),
    /// Run the daemon in the foreground (caches, cores, NBD exports, admin socket, metrics).
    Daemon(admin_cmds::DaemonArgs),
    /// Create a cache on a device (or load the one it holds with --load).
    StartCache(admin_cmds::StartCache),
    /// Attach a core device to a cache; it is exported over NBD.
    AddCore(admin_cmds::AddCore),
    /// Detach a core (its dirty data is written back first).
    RemoveCore(admin_cmds::RemoveCore),
    /// Stop a cache (dirty data is written back first unless --no-writeback).
    StopCache(admin_cmds::StopCache),
    /// List caches and cores with their states.
    List(admin_cmds::List),
    /// Statistics of caches, cores and IO classes.
    Stats(admin_cmds::Stats),
    /// Set parameters of a group (seq-cutoff, cleaning, cleaning-alru, cleaning-acp,
    /// promotion, promotion-nhit, wl-writeback).
    SetParam(admin_cmds::SetParam),
    /// Show a parameter group, each value with its unit.
    GetParam(admin_cmds::GetParam),
    /// Switch a cache's mode (leaving wb/wo writes dirty data back first).
    SetMode(admin_cmds::SetMode),
    /// IO classes: load an Open CAS CSV, or list the classes in force.
    IoClass {
        #[command(subcommand)]
        what: admin_cmds::IoClass,
    },
    /// Write all dirty data back, with progress.
    Writeback(admin_cmds::Writeback),
    /// Drop a core's cached and unwritten data (needs --force).
    Invalidate(admin_cmds::Invalidate),
    /// Zero a cache's counters.
    ResetCounters(admin_cmds::ResetCounters),
    /// Stop every cache cleanly and end the daemon.
    Shutdown(admin_cmds::Shutdown),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions(shell::CompletionsArgs),
    /// Print the man page (or write one per verb with --out DIR).
    Man(shell::ManArgs),
}

#[derive(Subcommand)]
enum SimCmd {
    /// Miss-ratio curve of a block trace: miss ratio by cache size (docs/SIZING.md).
    Mrc(Box<sim_mrc::Args>),
    /// The devices (disks, volumes) a block trace holds, with their request counts.
    Devices(sim_mrc::DevicesArgs),
}

#[derive(Subcommand)]
enum BenchCmd {
    /// Cache-core micro-benchmark: decision time per hit and metadata RAM per line.
    Core(bench::core::Args),
    /// Load and recovery time of a persistent cache with a cold page cache.
    Load(bench::load::Args),
    /// 4K random reads and a 70/30 mix against the peers (nbdkit memory, nbdkit's cache
    /// filter, fio on the cache device), servers and fio pinned apart, median of alternating
    /// rounds.
    Peers(Box<bench::peers::Args>),
    /// Mode wl in front of a Ceph RBD image vs plain librbd and librbd's writeback cache (fio
    /// 4K randwrite, QD 1-64, cache not full and full); starts its own cluster.
    Wl(Box<bench::wl::Args>),
    /// Cache hits while writeback runs to an emulated HDD (4K random and 256K sequential,
    /// idle vs during a writeback), on the reactor and the threaded NBD paths.
    WbHits(bench::wbhits::Args),
}

/// A command-line error as one line on stderr (clap's message without its usage block, which
/// names what was wrong, then where to look), exit status 2. `--help` and `--version` print as
/// clap does; so does a bare `tiercache` (the list of verbs).
fn usage_error(e: clap::Error) -> ! {
    use clap::error::ErrorKind;
    if e.kind() == ErrorKind::DisplayVersion {
        print!("{}", shell::version_text());
        std::process::exit(0);
    }
    if matches!(
        e.kind(),
        ErrorKind::DisplayHelp | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    ) {
        e.exit();
    }
    let text = e.render().to_string();
    let mut msg = String::new();
    for l in text.lines().map(str::trim) {
        if l.starts_with("Usage:") || l.starts_with("For more information") {
            break;
        }
        if l.is_empty() {
            continue;
        }
        if !msg.is_empty() {
            msg.push_str(if l.starts_with("tip:") { "; " } else { " " });
        }
        msg.push_str(l.strip_prefix("error: ").unwrap_or(l));
    }
    // The verbs given (the subcommands named on the way down, wherever the flags are).
    let mut verbs = Vec::new();
    let mut at = shell::command::<Cli>();
    for a in std::env::args_os().skip(1) {
        let Some(sub) = at.find_subcommand(&a).cloned() else {
            continue;
        };
        verbs.push(sub.get_name().to_string());
        at = sub;
    }
    let help = ["tiercache".to_string()]
        .into_iter()
        .chain(verbs)
        .chain(["--help".to_string()])
        .collect::<Vec<_>>()
        .join(" ");
    eprintln!("tiercache: {msg}; see '{help}'");
    std::process::exit(2);
}

fn main() {
    // Output piped into `head` and the like ends quietly, as for any Unix tool.
    // SAFETY: restoring the default disposition of SIGPIPE before any thread exists.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    let cmd = shell::command::<Cli>();
    let cli = cmd
        .clone()
        .try_get_matches()
        .and_then(|m| Cli::from_arg_matches(&m))
        .unwrap_or_else(|e| usage_error(e));
    // `--cache-id` of set-param/get-param may come before or after the group (a global
    // argument, which clap cannot require).
    if let Cmd::SetParam(admin_cmds::SetParam {
        at: admin_cmds::ParamAt { cache_id: None, .. },
        ..
    })
    | Cmd::GetParam(admin_cmds::GetParam {
        at: admin_cmds::ParamAt { cache_id: None, .. },
        ..
    }) = &cli.cmd
    {
        usage_error(cmd.clone().error(
            clap::error::ErrorKind::MissingRequiredArgument,
            "the following required arguments were not provided: --cache-id <CACHE_ID>",
        ));
    }
    let result = match cli.cmd {
        Cmd::Bench {
            what: Some(BenchCmd::Core(args)),
            ..
        } => bench::core::run(args),
        Cmd::Bench {
            what: Some(BenchCmd::Load(args)),
            ..
        } => bench::load::run(args),
        Cmd::Bench {
            what: Some(BenchCmd::Peers(args)),
            ..
        } => bench::peers::run(*args),
        Cmd::Bench {
            what: Some(BenchCmd::Wl(args)),
            ..
        } => bench::wl::run(*args),
        Cmd::Bench {
            what: Some(BenchCmd::WbHits(args)),
            ..
        } => bench::wbhits::run(args),
        Cmd::Bench { what: None, args } => bench::run::run(args),
        Cmd::Sim {
            what: Some(SimCmd::Mrc(args)),
            ..
        } => sim_mrc::run(*args),
        Cmd::Sim {
            what: Some(SimCmd::Devices(args)),
            ..
        } => sim_mrc::devices(args),
        Cmd::Sim { what: None, args } => sim_cmd::run(args),
        Cmd::Inspect(args) => inspect::inspect(args),
        Cmd::Check(args) => std::process::exit(inspect::check(args)),
        Cmd::Daemon(a) => admin_cmds::daemon(a),
        Cmd::StartCache(a) => admin_cmds::start_cache(a),
        Cmd::AddCore(a) => admin_cmds::add_core(a),
        Cmd::RemoveCore(a) => admin_cmds::remove_core(a),
        Cmd::StopCache(a) => admin_cmds::stop_cache(a),
        Cmd::List(a) => admin_cmds::list(a),
        Cmd::Stats(a) => admin_cmds::stats(a),
        Cmd::SetParam(a) => admin_cmds::set_param(a),
        Cmd::GetParam(a) => admin_cmds::get_param(a),
        Cmd::SetMode(a) => admin_cmds::set_mode(a),
        Cmd::IoClass { what } => admin_cmds::io_class(what),
        Cmd::Writeback(a) => admin_cmds::writeback(a),
        Cmd::Invalidate(a) => admin_cmds::invalidate(a),
        Cmd::ResetCounters(a) => admin_cmds::reset_counters(a),
        Cmd::Shutdown(a) => admin_cmds::shutdown(a),
        Cmd::Completions(a) => shell::completions(a, cmd),
        Cmd::Man(a) => shell::man(a, cmd),
    };
    if let Err(e) = result {
        eprintln!("tiercache: {e}");
        std::process::exit(1);
    }
}

//! What the command line says about itself: the top `--help` with the verbs in groups and
//! examples, `--version` with the build and what this machine offers, and the `completions`
//! and `man` verbs, generated from the same clap definitions as the parser.

use clap::{Args, Command, CommandFactory};
use std::io::Write;
use std::path::PathBuf;

/// The verbs in the order and groups of the top `--help` (every verb is in exactly one: a test
/// checks it).
pub const VERB_GROUPS: &[(&str, &[&str])] = &[
    ("Daemon", &["daemon", "shutdown"]),
    (
        "Caches and cores",
        &[
            "start-cache",
            "stop-cache",
            "add-core",
            "remove-core",
            "set-mode",
            "writeback",
            "invalidate",
        ],
    ),
    ("Observe", &["list", "stats", "reset-counters"]),
    ("Tune", &["set-param", "get-param", "io-class"]),
    ("Offline, read-only (no daemon)", &["inspect", "check"]),
    ("Measure and predict", &["bench", "sim"]),
    ("Shell", &["completions", "man"]),
];

const EXAMPLES: &str = "Examples:
  tiercache daemon --config /etc/tiercache/tiercache.toml
  tiercache start-cache --cache-device /dev/nvme0n1p1 --mode wb
  tiercache add-core --cache-id 1 --core-device /dev/sdb --export osd0
  tiercache list
  tiercache set-param --cache-id 1 seq-cutoff --policy always --threshold 1MiB
  tiercache check --cache-device /dev/nvme0n1p1 --json
  tiercache completions bash > /etc/bash_completion.d/tiercache

Each verb: tiercache VERB --help. Admin verbs reach the daemon at $TIERCACHE_SOCKET, else
$XDG_RUNTIME_DIR/tiercache/admin.sock (/run/tiercache/admin.sock for root), or --socket.
A failed verb prints one line on stderr and exits non-zero (2 for a wrong command line).";

/// The version line: `0.1.0 (commit abc1234)`.
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("TIERCACHE_COMMIT"),
    ")"
);

/// The whole command line: the derived parser with the grouped top `--help`.
pub fn command<C: CommandFactory>() -> Command {
    let cmd = C::command();
    let verbs = grouped_verbs(&cmd);
    cmd.help_template(format!(
        "{{before-help}}{{about-with-newline}}\n{{usage-heading}} {{usage}}\n\n{verbs}Options:\n{{options}}{{after-help}}"
    ))
    .after_help(EXAMPLES)
}

/// The verbs of `cmd` under the headings of [`VERB_GROUPS`], each with its one-line about.
fn grouped_verbs(cmd: &Command) -> String {
    let width = cmd
        .get_subcommands()
        .map(|c| c.get_name().len())
        .max()
        .unwrap_or(0);
    let mut s = String::new();
    for (heading, verbs) in VERB_GROUPS {
        s.push_str(heading);
        s.push_str(":\n");
        for v in *verbs {
            let about = cmd
                .find_subcommand(v)
                .and_then(Command::get_about)
                .map(|a| a.to_string())
                .unwrap_or_default();
            let first = about.lines().next().unwrap_or("");
            s.push_str(&format!("  {v:<width$}  {first}\n"));
        }
        s.push('\n');
    }
    s
}

/// `--version`: the build, and what this machine offers (io_uring and librbd are found at run
/// time, so the answer is this machine's).
pub fn version_text() -> String {
    let uring = match tiercache_io::Ring::new(2) {
        Ok(_) => "available (file devices and NBD connections use it)".to_string(),
        Err(e) => format!("not available ({e}): pread/pwrite and worker threads are used"),
    };
    let rbd = match tiercache_io::rbd_available() {
        Ok(()) => "found (rbd: core devices can be used)".to_string(),
        Err(e) => format!("not found ({e}): rbd: core devices cannot be used"),
    };
    format!(
        "tiercache {VERSION}\nbuilt by {} for {}, {} profile\nio_uring: {uring}\nlibrbd: {rbd}\n",
        env!("TIERCACHE_RUSTC"),
        env!("TIERCACHE_TARGET"),
        env!("TIERCACHE_PROFILE"),
    )
}

/// `tiercache completions SHELL`.
#[derive(Args)]
#[command(after_help = "Install, e.g.:
  tiercache completions bash > /etc/bash_completion.d/tiercache
  tiercache completions zsh > /usr/local/share/zsh/site-functions/_tiercache
  tiercache completions fish > ~/.config/fish/completions/tiercache.fish")]
pub struct CompletionsArgs {
    /// The shell to write a completion script for.
    shell: clap_complete::Shell,
}

/// `tiercache man`.
#[derive(Args)]
pub struct ManArgs {
    /// Write tiercache.1 and a page per verb (tiercache-VERB.1, ...) into this directory
    /// instead of printing tiercache.1.
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
}

/// Writes the completion script of `shell` for `cmd` to stdout.
pub fn completions(a: CompletionsArgs, mut cmd: Command) -> Result<(), String> {
    let mut out = std::io::stdout().lock();
    clap_complete::generate(a.shell, &mut cmd, "tiercache", &mut out);
    out.flush()
        .map_err(|e| format!("writing the completions: {e}"))
}

/// Writes the man page(s) of `cmd`.
pub fn man(a: ManArgs, cmd: Command) -> Result<(), String> {
    let cmd = cmd.version(VERSION);
    match a.out {
        Some(dir) => {
            std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            clap_mangen::generate_to(cmd, &dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            println!("man pages written to {}", dir.display());
            Ok(())
        }
        None => {
            let mut out = std::io::stdout().lock();
            clap_mangen::Man::new(cmd)
                .render(&mut out)
                .and_then(|()| out.flush())
                .map_err(|e| format!("writing the man page: {e}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cli() -> Command {
        command::<crate::Cli>()
    }

    /// Every command under `c` (itself included), with its path.
    fn all(c: &Command, path: String, out: &mut Vec<(String, Command)>) {
        out.push((path.clone(), c.clone()));
        for s in c.get_subcommands() {
            all(s, format!("{path} {}", s.get_name()), out);
        }
    }

    #[test]
    fn the_top_help_groups_every_verb_once() {
        let c = cli();
        let mut listed: Vec<&str> = VERB_GROUPS
            .iter()
            .flat_map(|(_, v)| v.iter().copied())
            .collect();
        let n = listed.len();
        listed.sort_unstable();
        listed.dedup();
        assert_eq!(listed.len(), n, "a verb in two groups");
        let mut verbs: Vec<&str> = c
            .get_subcommands()
            .map(Command::get_name)
            .filter(|v| *v != "help")
            .collect();
        verbs.sort_unstable();
        assert_eq!(listed, verbs, "VERB_GROUPS and the verbs differ");
        let help = c.clone().render_long_help().to_string();
        for v in verbs {
            assert!(
                help.contains(&format!("\n  {v} ")),
                "{v} not in --help:\n{help}"
            );
        }
        assert!(help.starts_with("A userspace block cache"), "{help}");
        assert!(help.contains("Examples:"), "{help}");
    }

    /// A word such as `P1`, `C19` or `R6`: an id of the product spec's targets, which means
    /// nothing to a user.
    fn target_id(w: &str) -> bool {
        let mut ch = w.chars();
        matches!(ch.next(), Some('P' | 'C' | 'R'))
            && w.len() > 1
            && w.len() <= 3
            && ch.all(|c| c.is_ascii_digit())
    }

    #[test]
    fn no_help_text_names_internal_targets() {
        let mut cmds = Vec::new();
        all(&cli(), "tiercache".into(), &mut cmds);
        assert!(cmds.len() > 40, "{}", cmds.len());
        for (path, mut c) in cmds {
            let help = c.render_long_help().to_string();
            assert!(!help.contains("SPEC"), "{path} --help names SPEC:\n{help}");
            let ids: Vec<&str> = help
                .split(|c: char| !c.is_ascii_alphanumeric())
                .filter(|w| target_id(w))
                .collect();
            assert!(ids.is_empty(), "{path} --help names {ids:?}:\n{help}");
        }
    }

    #[test]
    fn every_parameter_group_is_a_subcommand_with_its_parameters() {
        let c = cli();
        for verb in ["set-param", "get-param"] {
            let v = c.find_subcommand(verb).unwrap();
            let names: Vec<&str> = v.get_subcommands().map(Command::get_name).collect();
            assert_eq!(names.len(), 7, "{verb}: {names:?}");
            for g in crate::params::GROUPS {
                assert!(names.contains(&g.name), "{verb} {}", g.name);
            }
        }
        let mut alru = c
            .find_subcommand("set-param")
            .and_then(|s| s.find_subcommand("cleaning-alru"))
            .unwrap()
            .clone();
        let help = alru.render_long_help().to_string();
        for p in [
            "--wake-up",
            "--staleness-time",
            "--flush-max-buffers",
            "--activity-threshold",
        ] {
            assert!(help.contains(p), "{p}: {help}");
        }
    }
}

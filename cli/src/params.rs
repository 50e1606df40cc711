//! The parameter groups of `set-param` and `get-param`, as subcommands built from one table:
//! `set-param GROUP --help` lists the group's parameters with their units and ranges, a
//! parameter a group does not have is refused while the arguments are parsed, policies are
//! `ValueEnum`s, and times, sizes and percentages are checked to be ones before the daemon is
//! asked (which checks the ranges).
//!
//! Each parameter is read and printed in one unit, shown with it: `get-param` prints `30s`,
//! `500ms`, `1MiB`, `80%`, and `set-param` reads exactly that back. A bare number keeps the
//! unit it has always had (casadm's), named in the help.

use crate::choices::{CleaningPolicy, CutoffPolicy, PromotionPolicy};
use clap::builder::{EnumValueParser, ValueParser};
use clap::error::ErrorKind;
use clap::{Arg, ArgGroup, ArgMatches, Command, ValueEnum};
use std::time::Duration;
use tiercache_daemon::device::{parse_size, parse_time};

/// What a parameter's value is.
#[derive(Clone, Copy)]
enum Kind {
    /// One word of a `ValueEnum`.
    Choice(fn() -> ValueParser),
    /// A time; a bare number counts this unit.
    Time(Duration),
    /// A size; a bare number is KiB.
    Size,
    /// A percentage: `80` or `80%`.
    Percent,
    /// A whole number.
    Count,
}

/// One parameter of a group.
struct Param {
    name: &'static str,
    /// Other names it is known by (casadm's long names).
    aliases: &'static [&'static str],
    kind: Kind,
    help: &'static str,
}

/// One parameter group.
pub struct Group {
    pub name: &'static str,
    aliases: &'static [&'static str],
    about: &'static str,
    example: &'static str,
    params: &'static [Param],
}

fn choice<T: ValueEnum + Clone + Send + Sync + 'static>() -> ValueParser {
    EnumValueParser::<T>::new().into()
}

const SEC: Duration = Duration::from_secs(1);
const MS: Duration = Duration::from_millis(1);

/// Every group, in the order `--help` shows them.
pub const GROUPS: &[Group] = &[
    Group {
        name: "seq-cutoff",
        aliases: &["seq-detect"],
        about: "Sequential cutoff of a core's streams (--core-id; every core when absent)",
        example: "tiercache set-param --cache-id 1 seq-cutoff --policy always --threshold 1MiB",
        params: &[
            Param {
                name: "policy",
                aliases: &[],
                kind: Kind::Choice(choice::<CutoffPolicy>),
                help: "When sequential streams bypass the cache (default full)",
            },
            Param {
                name: "threshold",
                aliases: &[],
                kind: Kind::Size,
                help: "Length at which a stream is cut off: a size such as 1MiB or 512k; a bare number is KiB, as casadm's -t (default 1MiB)",
            },
            Param {
                name: "promotion-count",
                aliases: &[],
                kind: Kind::Count,
                help: "Requests a stream needs before it is trusted as sequential (1 to 65535, default 8)",
            },
        ],
    },
    Group {
        name: "cleaning",
        aliases: &[],
        about: "Which cleaning policy writes dirty data back",
        example: "tiercache set-param --cache-id 1 cleaning --policy acp",
        params: &[Param {
            name: "policy",
            aliases: &[],
            kind: Kind::Choice(choice::<CleaningPolicy>),
            help: "Cleaning policy (default alru)",
        }],
    },
    Group {
        name: "cleaning-alru",
        aliases: &[],
        about: "Parameters of the alru cleaning policy",
        example: "tiercache set-param --cache-id 1 cleaning-alru --wake-up 5s --staleness-time 30s",
        params: &[
            Param {
                name: "wake-up",
                aliases: &[],
                kind: Kind::Time(SEC),
                help: "Sleep after an idle round: 0s to 1h in whole seconds; a bare number is seconds (default 20s)",
            },
            Param {
                name: "staleness-time",
                aliases: &[],
                kind: Kind::Time(SEC),
                help: "Age a dirty line must reach to be written back: 1s to 1h in whole seconds; a bare number is seconds (default 2m)",
            },
            Param {
                name: "flush-max-buffers",
                aliases: &[],
                kind: Kind::Count,
                help: "Lines written back per round (1 to 10000, default 100)",
            },
            Param {
                name: "activity-threshold",
                aliases: &[],
                kind: Kind::Time(MS),
                help: "No cleaning while clients did IO within this time: 0s to 1000s in whole milliseconds; a bare number is milliseconds (default 10s)",
            },
        ],
    },
    Group {
        name: "cleaning-acp",
        aliases: &[],
        about: "Parameters of the acp cleaning policy",
        example: "tiercache set-param --cache-id 1 cleaning-acp --wake-up 20ms",
        params: &[
            Param {
                name: "wake-up",
                aliases: &[],
                kind: Kind::Time(MS),
                help: "Sleep between rounds: 0s to 10s in whole milliseconds; a bare number is milliseconds (default 10ms)",
            },
            Param {
                name: "flush-max-buffers",
                aliases: &[],
                kind: Kind::Count,
                help: "Lines written back per round (1 to 10000, default 128)",
            },
        ],
    },
    Group {
        name: "promotion",
        aliases: &[],
        about: "When a miss is inserted into the cache",
        example: "tiercache set-param --cache-id 1 promotion --policy nhit",
        params: &[Param {
            name: "policy",
            aliases: &[],
            kind: Kind::Choice(choice::<PromotionPolicy>),
            help: "Promotion policy (default always)",
        }],
    },
    Group {
        name: "promotion-nhit",
        aliases: &[],
        about: "Parameters of the nhit promotion policy",
        example: "tiercache set-param --cache-id 1 promotion-nhit --threshold 3 --trigger 80%",
        params: &[
            Param {
                name: "threshold",
                aliases: &["insertion-threshold"],
                kind: Kind::Count,
                help: "Misses of a line before it is inserted (2 to 1000, default 3)",
            },
            Param {
                name: "trigger",
                aliases: &["trigger-threshold"],
                kind: Kind::Percent,
                help: "Occupancy at which nhit engages; below it every miss is inserted, and a miss that fits in the free lines always is (0% to 100%, default 80%)",
            },
        ],
    },
    Group {
        name: "wl-writeback",
        aliases: &[],
        about: "When the write log's writeback runs (mode wl only; kept in memory, put it in the config file's [cache.params] to keep it)",
        example: "tiercache set-param --cache-id 2 wl-writeback --background-fill 0%",
        params: &[
            Param {
                name: "background-fill",
                aliases: &[],
                kind: Kind::Percent,
                help: "Log fill under which writeback waits while clients are busy (0% to 100%; 0%: it never waits; default 50%)",
            },
            Param {
                name: "idle",
                aliases: &[],
                kind: Kind::Time(MS),
                help: "Client idle time after which writeback runs below the fill: 0s to 1h in whole milliseconds; a bare number is milliseconds (default 500ms)",
            },
            Param {
                name: "expire",
                aliases: &[],
                kind: Kind::Time(SEC),
                help: "Age of the oldest log entry after which writeback runs below the fill: 0s to 24h in whole seconds; a bare number is seconds (default 30s)",
            },
            Param {
                name: "depth",
                aliases: &[],
                kind: Kind::Count,
                help: "Writes to the core in flight during writeback (1 to 4096, default 48)",
            },
        ],
    },
];

fn time_in_seconds(v: &str) -> Result<String, String> {
    checked_time(v, SEC, "seconds")
}

fn time_in_ms(v: &str) -> Result<String, String> {
    checked_time(v, MS, "milliseconds")
}

fn checked_time(v: &str, bare: Duration, name: &str) -> Result<String, String> {
    parse_time(v, bare).map(|_| v.to_string()).ok_or_else(|| {
        format!("not a time (want e.g. 500ms, 30s, 2m, 1h; a bare number is {name})")
    })
}

fn size(v: &str) -> Result<String, String> {
    parse_size(v)
        .map(|_| v.to_string())
        .map_err(|_| "not a size (want e.g. 512k, 1MiB; a bare number is KiB)".into())
}

fn percent(v: &str) -> Result<String, String> {
    v.strip_suffix('%')
        .unwrap_or(v)
        .parse::<u32>()
        .map(|_| v.to_string())
        .map_err(|_| "not a percentage (want e.g. 80% or 80)".into())
}

fn count(v: &str) -> Result<String, String> {
    v.parse::<u32>()
        .map(|_| v.to_string())
        .map_err(|_| "not a whole number".into())
}

impl Param {
    fn arg(&self) -> Arg {
        let (parser, value_name): (ValueParser, &str) = match self.kind {
            Kind::Choice(p) => (p(), "POLICY"),
            Kind::Time(u) if u == SEC => (ValueParser::new(time_in_seconds), "TIME"),
            Kind::Time(_) => (ValueParser::new(time_in_ms), "TIME"),
            Kind::Size => (ValueParser::new(size), "SIZE"),
            Kind::Percent => (ValueParser::new(percent), "PERCENT"),
            Kind::Count => (ValueParser::new(count), "N"),
        };
        Arg::new(self.name)
            .long(self.name)
            .aliases(self.aliases.iter().copied())
            .value_name(value_name)
            .value_parser(parser)
            .help(self.help)
            .help_heading("Parameters")
    }
}

impl Group {
    /// `set-param GROUP`: the group's parameters, at least one of them.
    fn set_command(&self) -> Command {
        let ids: Vec<&str> = self.params.iter().map(|p| p.name).collect();
        Command::new(self.name)
            .about(self.about)
            .visible_aliases(self.aliases.iter().copied())
            .args(self.params.iter().map(Param::arg))
            .group(ArgGroup::new("parameters").args(ids).required(true).multiple(true))
            .after_help(format!(
                "Prints the group as `get-param` does; that output given back to set-param changes nothing.\n\nExample:\n  {}",
                self.example
            ))
    }

    /// `get-param GROUP`.
    fn get_command(&self) -> Command {
        let names: Vec<&str> = self.params.iter().map(|p| p.name).collect();
        Command::new(self.name)
            .about(self.about)
            .visible_aliases(self.aliases.iter().copied())
            .after_help(format!(
                "Prints {} with their units (set-param reads them back as printed).",
                names.join(", ")
            ))
    }
}

/// How a group's subcommand is built: `set-param GROUP` (its parameters) or `get-param GROUP`.
pub trait Verb {
    fn command(g: &Group) -> Command;
}

/// `set-param GROUP --param value ...`.
pub struct Set;

/// `get-param GROUP`.
pub struct Get;

impl Verb for Set {
    fn command(g: &Group) -> Command {
        g.set_command()
    }
}

impl Verb for Get {
    fn command(g: &Group) -> Command {
        g.get_command()
    }
}

/// The group named after `set-param` or `get-param`, and the parameters given (the words as
/// typed: the daemon parses them; none for `get-param`).
pub struct ParamGroup<V> {
    pub name: String,
    pub values: Vec<(String, String)>,
    verb: std::marker::PhantomData<V>,
}

impl<V> clap::FromArgMatches for ParamGroup<V> {
    fn from_arg_matches(m: &ArgMatches) -> Result<Self, clap::Error> {
        let (name, sub) = m.subcommand().ok_or_else(|| {
            clap::Error::raw(
                ErrorKind::MissingSubcommand,
                "a parameter group is required\n",
            )
        })?;
        let g = GROUPS.iter().find(|g| g.name == name).ok_or_else(|| {
            clap::Error::raw(
                ErrorKind::InvalidSubcommand,
                format!("unknown parameter group '{name}'\n"),
            )
        })?;
        // `get-param GROUP` has no parameters: `values` stays empty.
        let values = g
            .params
            .iter()
            .filter_map(|p| {
                let v = sub.try_get_raw(p.name).ok()??.next()?;
                Some((p.name.to_string(), v.to_string_lossy().into_owned()))
            })
            .collect();
        Ok(ParamGroup {
            name: g.name.to_string(),
            values,
            verb: std::marker::PhantomData,
        })
    }

    fn update_from_arg_matches(&mut self, m: &ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(m)?;
        Ok(())
    }
}

impl<V: Verb> clap::Subcommand for ParamGroup<V> {
    fn augment_subcommands(cmd: Command) -> Command {
        cmd.subcommands(GROUPS.iter().map(V::command))
            .subcommand_required(true)
            .disable_help_subcommand(true)
            .subcommand_value_name("GROUP")
            .subcommand_help_heading("Groups")
    }

    fn augment_subcommands_for_update(cmd: Command) -> Command {
        Self::augment_subcommands(cmd)
    }

    fn has_subcommand(name: &str) -> bool {
        GROUPS
            .iter()
            .any(|g| g.name == name || g.aliases.contains(&name))
    }
}

//! Report writing: the report directory, the JSON header every report starts with
//! ([`report_header`]), the commit the numbers belong to, PASS/FAIL, and the progress bar.

use super::host::host;
use serde_json::{Value, json};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A progress bar on stderr (only when it is a terminal).
pub(crate) struct Bar {
    pub(crate) tty: bool,
}

impl Bar {
    pub(crate) fn show(&self, label: &str, frac: f64) {
        if !self.tty {
            return;
        }
        let w = 30;
        let n = (frac * w as f64) as usize;
        let mut e = std::io::stderr();
        let _ = write!(
            e,
            "\r  {label:<28} [{}{}] {:3.0}%",
            "#".repeat(n),
            ".".repeat(w - n.min(w)),
            frac * 100.0
        );
        let _ = e.flush();
    }

    pub(crate) fn end(&self) {
        if self.tty {
            eprint!("\r{:70}\r", "");
        }
    }
}

/// How a target line starts: `PASS` when the target is met, else `FAIL`.
pub(crate) fn verdict(met: bool) -> &'static str {
    if met { "PASS" } else { "FAIL" }
}

/// The commit the numbers belong to: the one this executable was built from (`build.rs`
/// embeds it; `tiercache --version` shows the same), else the one of the checkout the
/// executable lies in, else `unknown`. Never the working directory's: a bench run outside the
/// repository said `unknown`, and one run inside another checkout named that one's commit.
pub(crate) fn git_commit() -> String {
    let built = env!("TIERCACHE_COMMIT");
    if built != "unknown" {
        return built.to_string();
    }
    std::env::current_exe()
        .ok()
        .and_then(|exe| {
            let dir = exe.parent()?.to_path_buf();
            Command::new("git")
                .arg("-C")
                .arg(dir)
                .args(["rev-parse", "--short", "HEAD"])
                .output()
                .ok()
        })
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into())
}

/// A report's JSON document: the header every benchmark starts with — `tool`, `version`,
/// `commit` ([`git_commit`]) and `host` ([`host`]) — then the fields of `body` (an object).
pub(crate) fn report_header(tool: &str, body: Value) -> Value {
    let mut doc = json!({
        "tool": tool,
        "version": env!("CARGO_PKG_VERSION"),
        "commit": git_commit(),
        "host": host(),
    });
    if let (Some(d), Value::Object(b)) = (doc.as_object_mut(), body) {
        d.extend(b);
    }
    doc
}

/// `commit C, CPU MODEL`: the line under a `report.md`'s title.
fn commit_and_cpu() -> String {
    format!(
        "commit {}, {}",
        git_commit(),
        host()["cpu"].as_str().unwrap_or("")
    )
}

/// The end of a run: its scratch directory removed (saying so when it cannot be), the
/// daemon's log back to stderr.
pub(crate) fn close_run(scratch: &Path) {
    if let Err(e) = std::fs::remove_dir_all(scratch) {
        eprintln!(
            "could not remove the scratch directory {}: {e}",
            scratch.display()
        );
    }
    tiercache_io::log::to_file(None);
}

/// The report directory (`--out`, else a new one from [`report_dir`]), created, with the log
/// of the daemon's parts (which run in this process) going to its `daemon.log`, not between
/// the results.
pub(crate) fn open_report(out: Option<&Path>) -> Result<PathBuf, String> {
    let out = match out {
        Some(o) => {
            std::fs::create_dir_all(o).map_err(|e| format!("--out {}: {e}", o.display()))?;
            o.to_path_buf()
        }
        None => report_dir()?,
    };
    let log = out.join("daemon.log");
    let f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .map_err(|e| format!("{}: {e}", log.display()))?;
    tiercache_io::log::to_file(Some(f));
    println!("report and daemon log (daemon.log) go to {}", out.display());
    Ok(out)
}

/// A new directory for a report without `--out`: `tiercache-bench-report-SECONDS-PID` under
/// the temporary directory (never the working directory, which may be a source tree).
fn report_dir() -> Result<PathBuf, String> {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let d = std::env::temp_dir().join(format!(
        "tiercache-bench-report-{secs}-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&d).map_err(|e| format!("{}: {e}", d.display()))?;
    Ok(d)
}

/// Writes a bench's JSON document to `json` (`--json`) and, with `out` (`--out`),
/// `results.json` and `report.md`: `title`, [`commit_and_cpu`], the printed tables (`text`).
pub(crate) fn write_results(
    json: Option<&Path>,
    out: Option<&Path>,
    title: &str,
    doc: &Value,
    text: &str,
) -> Result<(), String> {
    let body = serde_json::to_string_pretty(doc).unwrap_or_default();
    if let Some(p) = json {
        std::fs::write(p, &body).map_err(|e| format!("--json {}: {e}", p.display()))?;
    }
    if let Some(d) = out {
        let w = |n: &str, b: &str| {
            let p = d.join(n);
            std::fs::write(&p, b).map_err(|e| format!("{}: {e}", p.display()))
        };
        w("results.json", &body)?;
        w(
            "report.md",
            &format!(
                "# {title}\n\n{}\n\n```\n{text}```\n\nRaw numbers: results.json.\n",
                commit_and_cpu()
            ),
        )?;
    }
    Ok(())
}

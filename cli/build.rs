//! Records what `tiercache --version` says about the build: the git commit (`unknown` outside a
//! git checkout or without git), the compiler, the target and the profile.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let o = Command::new("git").args(args).output().ok()?;
    let s = String::from_utf8(o.stdout).ok()?.trim().to_string();
    (o.status.success() && !s.is_empty()).then_some(s)
}

fn main() {
    let commit = git(&["rev-parse", "--short", "HEAD"]).unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=TIERCACHE_COMMIT={commit}");
    // Built again when HEAD moves (a commit, a checkout): HEAD and the branch it names.
    for path in ["HEAD", "refs/heads", "packed-refs"] {
        if let Some(p) = git(&["rev-parse", "--git-path", path]) {
            println!("cargo:rerun-if-changed={p}");
        }
    }
    if let Some(r) = git(&["symbolic-ref", "-q", "HEAD"])
        && let Some(p) = git(&["rev-parse", "--git-path", &r])
    {
        println!("cargo:rerun-if-changed={p}");
    }
    println!("cargo:rerun-if-changed=build.rs");
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let rustc_version = Command::new(rustc)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|| "rustc (unknown version)".into());
    println!("cargo:rustc-env=TIERCACHE_RUSTC={rustc_version}");
    for (k, v) in [
        ("TARGET", "TIERCACHE_TARGET"),
        ("PROFILE", "TIERCACHE_PROFILE"),
    ] {
        let x = std::env::var(k).unwrap_or_else(|_| "unknown".into());
        println!("cargo:rustc-env={v}={x}");
    }
}

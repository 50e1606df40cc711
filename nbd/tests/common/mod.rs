//! Helpers shared by the NBD server tests.
#![allow(dead_code)]

pub mod wire;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;
use tiercache_core::Config;
use tiercache_core::cache::CoreRecord;
use tiercache_core::units::{CoreId, LineSize};
use tiercache_engine::{CoreSpec, Device, Engine, EngineConfig};
use tiercache_format::tables::CoreIdentity;
use tiercache_io::{Backend, RamBackend};
use tiercache_nbd::{BackendExport, EngineExport, ExportMap, ListenAddr, Server, ServerConfig};
use tiercache_testkit::rng::XorShift;
#[allow(unused_imports)]
pub use tiercache_testkit::{Dir, have, run_ok};

/// A fresh directory of the test's (`$TMPDIR/tc-nbd-TAG-PID-N`), removed at the end unless
/// the test panicked.
pub struct TmpDir(pub Dir);

impl TmpDir {
    pub fn new(tag: &str) -> TmpDir {
        TmpDir(Dir::fresh(&format!("nbd-{tag}")))
    }
    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

/// An engine with a RAM cache of `cache_mib` MiB (4 KiB lines, write-through) and one RAM core
/// (id 0) of `core_mib` MiB.
pub fn engine(core_mib: u64, cache_mib: u64) -> Arc<Engine> {
    let lines = (cache_mib << 20) / 4096;
    let cache: Device = Arc::new(RamBackend::new(lines * 8));
    let core: Device = Arc::new(RamBackend::new((core_mib << 20) / 512));
    engine_on(cache, core, 4)
}

/// A volatile write-through engine (4 KiB lines filling `cache`) over core 0 `core`, with
/// `io_threads` IO threads.
pub fn engine_on(cache: Device, core: Device, io_threads: usize) -> Arc<Engine> {
    let mut cfg = Config::new((cache.blocks() / 8) as u32, LineSize::K4);
    cfg.volatile = true;
    let e = Engine::create(
        cfg,
        cache,
        vec![CoreSpec {
            id: CoreId(0),
            dev: core,
            record: CoreRecord {
                identity: CoreIdentity::File {
                    fs_uuid: [7; 16],
                    inode: 1,
                },
                export_name: "disk".into(),
                device: String::new(),
            },
        }],
        EngineConfig::threads(io_threads),
    )
    .expect("engine");
    Arc::new(e)
}

/// The flushes core 0 of `e` has seen.
pub fn flushes(e: &Engine) -> u64 {
    e.with_cache(|c| c.core_counters(CoreId(0)).map_or(0, |k| k.flushes))
}

/// A running server on a unix socket with exports `disk` (engine, `core_mib`), `plain` (a
/// 8 MiB RAM backend, no cache) and `gone` (listed, refused).
pub struct Setup {
    pub engine: Arc<Engine>,
    pub exports: Arc<ExportMap>,
    pub server: Option<Server>,
    pub sock: PathBuf,
    pub dir: TmpDir,
}

impl Setup {
    pub fn new(tag: &str, core_mib: u64, cache_mib: u64) -> Setup {
        Setup::with_config(tag, core_mib, cache_mib, ServerConfig::default())
    }

    /// [`Setup::new`] with server settings `cfg`.
    pub fn with_config(tag: &str, core_mib: u64, cache_mib: u64, cfg: ServerConfig) -> Setup {
        let dir = TmpDir::new(tag);
        let engine = engine(core_mib, cache_mib);
        let exports = Arc::new(ExportMap::new());
        exports.insert(
            "disk",
            "cache0-core0 (test)",
            Arc::new(EngineExport::new(engine.clone(), CoreId(0))),
        );
        exports.insert(
            "plain",
            "a RAM disk without cache",
            Arc::new(BackendExport::new(Arc::new(RamBackend::new(8 << 11)))),
        );
        exports.refuse(
            "gone",
            "a core whose cache is missing",
            "cache device missing: not served",
        );
        let server = Server::new(exports.clone(), cfg);
        let sock = dir.path("nbd.sock");
        server
            .listen(&ListenAddr::Unix(sock.clone()))
            .expect("listen");
        Setup {
            engine,
            exports,
            server: Some(server),
            sock,
            dir,
        }
    }

    pub fn uri(&self, name: &str) -> String {
        format!("nbd+unix:///{name}?socket={}", self.sock.display())
    }

    pub fn server(&self) -> &Server {
        self.server.as_ref().unwrap()
    }
}

/// Runs a command, returning its output; panics if it cannot start.
pub fn run(cmd: &mut Command) -> Output {
    cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"))
}

/// Runs a Python script in nbdsh with each of `vars` bound (`URI = "…"`); returns stdout.
pub fn nbdsh(script: &str, vars: &[(&str, String)]) -> String {
    let mut pre = String::new();
    for (k, v) in vars {
        pre.push_str(&format!("{k} = {v:?}\n"));
    }
    run_ok(
        Command::new("nbdsh")
            .arg("-c")
            .arg(format!("{pre}{script}")),
    )
}

/// Writes `bytes` of seeded pseudo-random data to `path`.
pub fn random_file(path: &Path, bytes: usize, seed: u64) {
    std::fs::write(path, XorShift(seed | 1).words(bytes)).unwrap();
}

/// Asserts two files are byte-identical.
pub fn same_files(a: &Path, b: &Path) {
    let x = std::fs::read(a).unwrap();
    let y = std::fs::read(b).unwrap();
    assert_eq!(
        x.len(),
        y.len(),
        "{} and {} differ in size",
        a.display(),
        b.display()
    );
    if let Some(i) = x.iter().zip(&y).position(|(p, q)| p != q) {
        panic!("{} and {} differ at byte {i}", a.display(), b.display());
    }
}

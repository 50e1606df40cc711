//! Serves a RAM-backed engine export (RAM cache in front of a RAM core) on a unix socket, for
//! manual tests and quick benchmarks:
//!
//! ```text
//! cargo run --release -p tiercache-nbd --example serve -- /tmp/nbd.sock 1024 256
//! fio --ioengine=nbd --uri='nbd+unix:///disk?socket=/tmp/nbd.sock' --rw=randread --bs=4k ...
//! ```
//!
//! Arguments: socket path, core size in MiB (default 1024), cache size in MiB (default 256).
//! Runs until killed.

use std::sync::Arc;
use tiercache_core::Config;
use tiercache_core::cache::CoreRecord;
use tiercache_core::units::{CoreId, LineSize};
use tiercache_engine::{CoreSpec, Device, Engine, EngineConfig};
use tiercache_format::tables::CoreIdentity;
use tiercache_io::RamBackend;
use tiercache_nbd::{EngineExport, ExportMap, ListenAddr, Server, ServerConfig};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let sock = args
        .get(1)
        .cloned()
        .unwrap_or_else(|| "/tmp/tiercache-nbd.sock".into());
    let core_mib: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(1024);
    let cache_mib: u64 = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(256);
    let lines = (cache_mib << 20) / 4096;
    let mut cfg = Config::new(lines as u32, LineSize::K4);
    cfg.volatile = true;
    let engine = Engine::create(
        cfg,
        Arc::new(RamBackend::new(lines * 8)),
        vec![CoreSpec {
            id: CoreId(0),
            dev: Arc::new(RamBackend::new((core_mib << 20) / 512)) as Device,
            record: CoreRecord {
                identity: CoreIdentity::File {
                    fs_uuid: [0; 16],
                    inode: 0,
                },
                export_name: "disk".into(),
                device: String::new(),
            },
        }],
        EngineConfig::default(),
    )
    .expect("engine");
    let exports = Arc::new(ExportMap::new());
    exports.insert(
        "disk",
        "RAM cache over a RAM core",
        Arc::new(EngineExport::new(Arc::new(engine), CoreId(0))),
    );
    let server = Server::new(exports, ServerConfig::default());
    server
        .listen(&ListenAddr::Unix(sock.clone().into()))
        .unwrap_or_else(|e| panic!("{e}"));
    println!("serving nbd+unix:///disk?socket={sock}");
    loop {
        std::thread::park();
    }
}

//! The registry's cores as NBD exports: each name resolves, at every new connection, to the
//! core of a running cache (through the engine), to the bare core device (a detached cache
//! whose config forces it), or to the reason it is not served.

use crate::registry::{ExportTarget, Registry};
use std::sync::Arc;
use tiercache_nbd::{
    BackendExport, BoundAddr, EngineExport, Export, Exports, ListenAddr, Server, ServerConfig,
};

struct RegistryExports(Arc<Registry>);

impl Exports for RegistryExports {
    fn list(&self) -> Vec<(String, String)> {
        self.0.exports()
    }

    fn get(&self, name: &str) -> Result<Arc<dyn Export>, String> {
        // Made only for a name that resolves: clients cannot grow the table with made-up names.
        let target = self.0.export(name)?;
        let stats = self.0.request_stats(name);
        match target {
            ExportTarget::Cached(engine, core, _) => Ok(Arc::new(
                EngineExport::new(engine, core).with_request_stats(stats),
            )),
            ExportTarget::Bare(dev) => {
                Ok(Arc::new(BackendExport::new(dev).with_request_stats(stats)))
            }
        }
    }
}

/// The running NBD server.
pub struct NbdHandle(Arc<Server>);

impl NbdHandle {
    /// Stops listening and closes every connection.
    pub fn shutdown(self) {
        self.0.shutdown();
    }
}

/// Starts the NBD server with a listener on each of `listen` (`unix:PATH`, `tcp:HOST:PORT`):
/// unix sockets 0600 (0660 with the socket group), TLS required on every listener when
/// configured.
pub fn start(
    reg: Arc<Registry>,
    listen: &[String],
    sec: &crate::server::Security,
    threaded: bool,
) -> Result<NbdHandle, String> {
    let addrs: Vec<ListenAddr> = listen
        .iter()
        .map(|s| ListenAddr::parse(s))
        .collect::<Result<_, _>>()?;
    let server = Server::new(
        Arc::new(RegistryExports(reg.clone())),
        ServerConfig {
            log_connections: true,
            socket_mode: if sec.socket_group.is_some() {
                0o660
            } else {
                0o600
            },
            socket_group: sec.socket_group,
            reactor: !threaded,
            ..Default::default()
        },
    );
    for a in &addrs {
        let bound = server.listen_tls(a, sec.tls.clone())?;
        crate::log!(
            info,
            "NBD listening",
            address = match &bound {
                BoundAddr::Unix(p) => format!("unix:{}", p.display()),
                BoundAddr::Tcp(a) => format!("tcp:{a}"),
            },
            tls = sec.tls.is_some()
        );
    }
    let server = Arc::new(server);
    // For `/metrics` (connections); weak, since the server holds the registry.
    reg.set_nbd_server(Arc::downgrade(&server));
    Ok(NbdHandle(server))
}

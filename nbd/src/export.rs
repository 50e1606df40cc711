//! What the server serves: the [`Export`] and [`Exports`] traits, and exports over the engine
//! ([`EngineExport`]) and over a plain backend ([`BackendExport`]).

use crate::latency::RequestStats;
use crate::proto::errno;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use tiercache_core::ReqError;
use tiercache_core::config::REQUEST_BLOCKS_MAX;
use tiercache_core::units::CoreId;
use tiercache_engine::Engine;
use tiercache_io::{AlignedBuf, Backend, Extent, IoErr};

/// The largest READ/WRITE payload advertised and accepted (32 MiB, the engine's request limit).
pub const MAX_BLOCK: u32 = REQUEST_BLOCKS_MAX * 512;

/// Block size constraints of an export (`NBD_INFO_BLOCK_SIZE`), in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockSizes {
    /// Smallest addressable unit: offsets and lengths must be multiples of it (a power of two,
    /// at most 64 KiB). Requests that are not get `EINVAL`.
    pub min: u32,
    /// Size and alignment for efficient IO (a power of two ≥ max(min, 512)).
    pub preferred: u32,
    /// Largest READ/WRITE payload (a multiple of `min`); longer reads and writes get `EINVAL`.
    pub max: u32,
}

impl BlockSizes {
    /// 512-byte minimum, `preferred`, 32 MiB maximum.
    pub fn new(preferred: u32) -> BlockSizes {
        BlockSizes {
            min: 512,
            preferred: preferred.max(512),
            max: MAX_BLOCK,
        }
    }

    /// Checks the protocol's rules; the server refuses to serve an export that breaks them.
    pub fn check(&self) -> Result<(), String> {
        let ok = self.min.is_power_of_two()
            && self.min <= 65536
            && self.preferred.is_power_of_two()
            && self.preferred >= self.min.max(512)
            && self.max >= self.preferred
            && self.max.is_multiple_of(self.min);
        if ok {
            Ok(())
        } else {
            Err(format!("invalid block sizes {self:?}"))
        }
    }
}

impl Default for BlockSizes {
    fn default() -> Self {
        BlockSizes::new(4096)
    }
}

/// Why an export operation failed; each maps to an NBD error value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExportError {
    /// Bad request (out of range read or trim, misaligned): `EINVAL`.
    Invalid,
    /// Write past the end: `ENOSPC`.
    NoSpace,
    /// Device error: `EIO`.
    Io(String),
    /// The export is going away (cache stopping): `ESHUTDOWN`.
    Shutdown,
    /// The operation is not supported: `ENOTSUP`.
    NotSupported,
    /// The export is read-only: `EPERM`.
    ReadOnly,
}

impl ExportError {
    /// The NBD error value sent to the client.
    pub fn errno(&self) -> u32 {
        match self {
            ExportError::Invalid => errno::EINVAL,
            ExportError::NoSpace => errno::ENOSPC,
            ExportError::Io(_) => errno::EIO,
            ExportError::Shutdown => errno::ESHUTDOWN,
            ExportError::NotSupported => errno::ENOTSUP,
            ExportError::ReadOnly => errno::EPERM,
        }
    }
}

impl fmt::Display for ExportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExportError::Invalid => f.write_str("invalid request"),
            ExportError::NoSpace => f.write_str("write past the end of the export"),
            ExportError::Io(m) => write!(f, "IO error: {m}"),
            ExportError::Shutdown => f.write_str("the export is shutting down"),
            ExportError::NotSupported => f.write_str("not supported"),
            ExportError::ReadOnly => f.write_str("the export is read-only"),
        }
    }
}

impl std::error::Error for ExportError {}

impl From<ReqError> for ExportError {
    fn from(e: ReqError) -> Self {
        match e {
            ReqError::OutOfRange => ExportError::Invalid,
            ReqError::PastEnd => ExportError::NoSpace,
            ReqError::Io(e) => ExportError::Io(format!("{e:?}")),
            ReqError::NoSuchCore => ExportError::Io("the core is not attached".into()),
            ReqError::NotRunning => ExportError::Shutdown,
        }
    }
}

impl From<IoErr> for ExportError {
    fn from(e: IoErr) -> Self {
        match e {
            IoErr::OutOfRange { .. } => ExportError::Invalid,
            IoErr::Misaligned { .. } => ExportError::Invalid,
            e => ExportError::Io(e.to_string()),
        }
    }
}

/// One export: a range of bytes with block-device operations.
///
/// The server checks every request against [`Export::size`] and [`Export::block_sizes`]
/// before calling, so offsets and lengths arrive aligned to `min` and inside the export (a
/// client that did not negotiate block sizes may send any alignment: the server turns those
/// requests into aligned ones, reading and merging the partly covered blocks itself);
/// implementations still return errors rather than panic on bad input. Methods are called
/// from many threads at once.
///
/// **Multi-conn.** The server advertises `NBD_FLAG_CAN_MULTI_CONN`, so [`Export::flush`] must
/// make durable every write whose reply was sent before the flush began, on *any* connection
/// to the export, and a FUA write must be durable when it returns.
pub trait Export: Send + Sync {
    /// Size in bytes (read at each `NBD_OPT_GO`/`INFO`/`EXPORT_NAME`: a resize is seen by new
    /// connections).
    fn size(&self) -> u64;
    /// Block size constraints.
    fn block_sizes(&self) -> BlockSizes;
    /// Whether writes are refused (`EPERM`; `NBD_FLAG_READ_ONLY` is advertised).
    fn read_only(&self) -> bool {
        false
    }
    /// Reads `buf.len()` bytes at `offset`.
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), ExportError>;
    /// Writes `data` at `offset` (durable at return with `fua`).
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), ExportError>;
    /// Makes every write completed before it durable (on any connection).
    fn flush(&self) -> Result<(), ExportError>;
    /// Discards `len` bytes at `offset` (they read back as zeros).
    fn trim(&self, offset: u64, len: u64) -> Result<(), ExportError>;
    /// Writes `len` zero bytes at `offset` (durable at return with `fua`). Must be fast (no
    /// payload-sized data movement from the client), as `NBD_FLAG_SEND_FAST_ZERO` promises.
    fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> Result<(), ExportError>;
    /// Prefetches `len` bytes at `offset` (warm-up); the data is not returned.
    fn cache(&self, offset: u64, len: u64) -> Result<(), ExportError>;
    /// Block status (`NBD_CMD_BLOCK_STATUS`, `base:allocation`) of `len` bytes at `offset`:
    /// runs of 512-byte blocks from `offset` covering at least its first block, a run marked
    /// [`Extent::hole`] reading as zeros. The default knows nothing: all allocated (always
    /// correct).
    fn extents(&self, _offset: u64, len: u64) -> Result<Vec<Extent>, ExportError> {
        Ok(Extent::allocated(len.div_ceil(512)))
    }
    /// Reads into an owned aligned buffer and hands it back (avoids a copy where the export
    /// can fill it directly). The default calls [`Export::read`].
    fn read_owned(
        &self,
        offset: u64,
        mut buf: AlignedBuf,
    ) -> (Result<(), ExportError>, AlignedBuf) {
        let r = self.read(offset, &mut buf);
        (r, buf)
    }
    /// Starts a read from a thread that must not wait for a device (a connection's reader):
    /// finishes it there if that needs no waiting (a hit in a RAM cache), and otherwise says
    /// what is left for a worker. The default starts nothing.
    fn read_start(&self, _offset: u64, buf: AlignedBuf) -> ReadStart {
        ReadStart::NotStarted(buf)
    }
    /// Which bytes this export serves: connections to exports with equal keys share one set of
    /// range locks for unaligned requests (`unaligned.rs`), even when each connection got its
    /// own export object (the daemon makes one per connection). The default is the object's
    /// address.
    fn data_key(&self) -> (usize, u64) {
        (self as *const Self as *const u8 as usize, 0)
    }
    /// The engine export behind this one, if it is one: a connection on a plain socket then
    /// runs its requests on its own io_uring reactor (`reactor.rs`), without worker threads.
    fn as_engine(&self) -> Option<&EngineExport> {
        None
    }
    /// Where the server counts this export's request latencies and client bytes (shared by
    /// every connection to it), if anywhere.
    fn request_stats(&self) -> Option<&RequestStats> {
        None
    }
    /// Writes an owned aligned buffer and hands it back. The default calls [`Export::write`].
    fn write_owned(
        &self,
        offset: u64,
        buf: AlignedBuf,
        fua: bool,
    ) -> (Result<(), ExportError>, AlignedBuf) {
        let r = self.write(offset, &buf, fua);
        (r, buf)
    }
}

/// A read finished by the calling thread.
pub type ReadReply = (Result<(), ExportError>, AlignedBuf);

/// What [`Export::read_start`] did.
pub enum ReadStart {
    /// The read finished: its reply.
    Done(ReadReply),
    /// The read started and waits for a device: a worker finishes it with this.
    Pending(Box<dyn FnOnce() -> ReadReply + Send>),
    /// Nothing started: a worker reads with [`Export::read_owned`].
    NotStarted(AlignedBuf),
}

/// The set of exports a server offers; exports may come and go while it runs.
pub trait Exports: Send + Sync {
    /// (name, description) of every export, for `NBD_OPT_LIST`.
    fn list(&self) -> Vec<(String, String)>;
    /// The export called `name`, or why it is not served (sent to the client with
    /// `NBD_REP_ERR_UNKNOWN`, e.g. "cache device missing: not served").
    fn get(&self, name: &str) -> Result<Arc<dyn Export>, String>;
    /// The description of export `name` (for `NBD_INFO_DESCRIPTION`).
    fn description(&self, name: &str) -> Option<String> {
        self.list()
            .into_iter()
            .find(|(n, _)| n == name)
            .map(|(_, d)| d)
    }
}

/// Name → (description, the export or why it is not served).
type Entries = BTreeMap<String, (String, Result<Arc<dyn Export>, String>)>;

/// A simple registry: a map from names to exports (or to the reason they are not served).
#[derive(Default)]
pub struct ExportMap {
    map: Mutex<Entries>,
}

impl ExportMap {
    /// An empty registry.
    pub fn new() -> ExportMap {
        ExportMap::default()
    }

    /// Adds or replaces export `name`.
    pub fn insert(&self, name: &str, description: &str, export: Arc<dyn Export>) {
        self.lock()
            .insert(name.into(), (description.into(), Ok(export)));
    }

    /// Lists `name` but refuses to serve it, saying `reason`.
    pub fn refuse(&self, name: &str, description: &str, reason: &str) {
        self.lock()
            .insert(name.into(), (description.into(), Err(reason.into())));
    }

    /// Removes export `name` (connections already using it keep it until they close).
    pub fn remove(&self, name: &str) -> bool {
        self.lock().remove(name).is_some()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Entries> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Exports for ExportMap {
    fn list(&self) -> Vec<(String, String)> {
        self.lock()
            .iter()
            .map(|(n, (d, _))| (n.clone(), d.clone()))
            .collect()
    }

    fn get(&self, name: &str) -> Result<Arc<dyn Export>, String> {
        match self.lock().get(name) {
            Some((_, r)) => r.clone(),
            None => Err(format!("no export named {name:?}")),
        }
    }

    fn description(&self, name: &str) -> Option<String> {
        self.lock().get(name).map(|(d, _)| d.clone())
    }
}

/// A core of the engine, served as an export.
///
/// Flush is the engine's flush of the core, which covers every write completed before it on
/// any thread — so a flush on one NBD connection covers writes replied on every other one
/// (multi-conn). Trims, zeroing and prefetches longer than the engine's request limit
/// (`REQUEST_BLOCKS_MAX` blocks, 32 MiB) are split.
pub struct EngineExport {
    engine: Arc<Engine>,
    core: CoreId,
    sizes: BlockSizes,
    stats: Option<Arc<RequestStats>>,
}

impl EngineExport {
    /// Serves core `core` of `engine`: minimum block 512, preferred the cache line size,
    /// maximum 32 MiB — for a write log (`wl`) at most the longest write one log entry takes
    /// (half its ring), so that clients split longer writes instead of getting `ENOSPC`.
    pub fn new(engine: Arc<Engine>, core: CoreId) -> EngineExport {
        let line = engine.with_cache(|c| c.config().line_size.bytes()) as u32;
        let mut sizes = BlockSizes::new(line);
        if let Some(blocks) = engine.with_machine(|m| m.wl().map(|w| w.max_request_blocks())) {
            let cap = (blocks * 512).min(MAX_BLOCK as u64) as u32;
            sizes.max = (cap / sizes.preferred * sizes.preferred).max(sizes.preferred);
        }
        EngineExport {
            engine,
            core,
            sizes,
            stats: None,
        }
    }

    /// Counts this export's requests in `stats` ([`Export::request_stats`]).
    pub fn with_request_stats(mut self, stats: Arc<RequestStats>) -> EngineExport {
        self.stats = Some(stats);
        self
    }

    /// Overrides the block sizes (e.g. a 4096-byte minimum when the cache or the core device
    /// has 4 KiB sectors). Fails if they break the protocol's rules.
    pub fn with_block_sizes(mut self, sizes: BlockSizes) -> Result<EngineExport, String> {
        sizes.check()?;
        if !sizes.min.is_multiple_of(512) || sizes.max > MAX_BLOCK {
            return Err(format!(
                "block sizes {sizes:?}: the engine needs multiples of 512 and at most {MAX_BLOCK}"
            ));
        }
        self.sizes = sizes;
        Ok(self)
    }

    /// The engine.
    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    /// The core served.
    pub fn core(&self) -> CoreId {
        self.core
    }

    /// The first block of a request at `offset` of `len` bytes (both multiples of 512).
    pub(crate) fn lba(offset: u64, len: u64) -> Result<u64, ExportError> {
        if !offset.is_multiple_of(512) || !len.is_multiple_of(512) {
            return Err(ExportError::Invalid);
        }
        Ok(offset / 512)
    }

    /// Runs `f(lba, blocks)` over `[offset, offset + len)` in pieces the engine accepts.
    fn split(
        offset: u64,
        len: u64,
        mut f: impl FnMut(u64, u32) -> Result<(), ReqError>,
    ) -> Result<(), ExportError> {
        let mut lba = Self::lba(offset, len)?;
        let mut left = len / 512;
        while left > 0 {
            let n = left.min(REQUEST_BLOCKS_MAX as u64);
            f(lba, n as u32)?;
            lba += n;
            left -= n;
        }
        Ok(())
    }
}

impl Export for EngineExport {
    fn size(&self) -> u64 {
        self.engine
            .core_device(self.core)
            .map_or(0, |d| d.blocks() * 512)
    }

    fn block_sizes(&self) -> BlockSizes {
        self.sizes
    }

    fn as_engine(&self) -> Option<&EngineExport> {
        Some(self)
    }

    fn data_key(&self) -> (usize, u64) {
        (Arc::as_ptr(&self.engine) as usize, u64::from(self.core.0))
    }

    fn request_stats(&self) -> Option<&RequestStats> {
        self.stats.as_deref()
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), ExportError> {
        let lba = Self::lba(offset, buf.len() as u64)?;
        Ok(self.engine.read(self.core, lba, buf)?)
    }

    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), ExportError> {
        let lba = Self::lba(offset, data.len() as u64)?;
        Ok(self.engine.write(self.core, lba, data, fua)?)
    }

    fn read_owned(&self, offset: u64, buf: AlignedBuf) -> (Result<(), ExportError>, AlignedBuf) {
        match Self::lba(offset, buf.len() as u64) {
            Ok(lba) => {
                let (r, b) = self.engine.read_owned(self.core, lba, buf);
                (r.map_err(Into::into), b)
            }
            Err(e) => (Err(e), buf),
        }
    }

    fn read_start(&self, offset: u64, buf: AlignedBuf) -> ReadStart {
        let lba = match Self::lba(offset, buf.len() as u64) {
            Ok(lba) => lba,
            Err(e) => return ReadStart::Done((Err(e), buf)),
        };
        match self.engine.read_start(self.core, lba, buf) {
            Ok((r, b)) => ReadStart::Done((r.map_err(Into::into), b)),
            Err(pending) => ReadStart::Pending(Box::new(move || {
                let (r, b) = pending.finish();
                (r.map_err(Into::into), b)
            })),
        }
    }

    fn write_owned(
        &self,
        offset: u64,
        buf: AlignedBuf,
        fua: bool,
    ) -> (Result<(), ExportError>, AlignedBuf) {
        match Self::lba(offset, buf.len() as u64) {
            Ok(lba) => {
                let (r, b) = self.engine.write_owned(self.core, lba, buf, fua);
                (r.map_err(Into::into), b)
            }
            Err(e) => (Err(e), buf),
        }
    }

    fn flush(&self) -> Result<(), ExportError> {
        Ok(self.engine.flush(self.core)?)
    }

    fn trim(&self, offset: u64, len: u64) -> Result<(), ExportError> {
        Self::split(offset, len, |lba, n| self.engine.trim(self.core, lba, n))
    }

    fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> Result<(), ExportError> {
        Self::split(offset, len, |lba, n| {
            self.engine.write_zeroes(self.core, lba, n, fua)
        })
    }

    fn extents(&self, offset: u64, len: u64) -> Result<Vec<Extent>, ExportError> {
        let lba = Self::lba(offset, len)?;
        Ok(self.engine.extents(self.core, lba, len / 512)?)
    }

    fn cache(&self, offset: u64, len: u64) -> Result<(), ExportError> {
        // Reads of at most 1 MiB through one reused buffer: the data lands in the cache (as
        // the promotion policy decides) and is dropped here.
        const CHUNK: u64 = 1 << 20;
        let mut lba = Self::lba(offset, len)?;
        let mut left = len;
        let mut buf = AlignedBuf::new(len.min(CHUNK) as usize);
        while left > 0 {
            let n = left.min(CHUNK);
            if n as usize != buf.len() {
                buf = AlignedBuf::new(n as usize);
            }
            let (r, b) = self.engine.read_owned(self.core, lba, buf);
            r?;
            buf = b;
            lba += n / 512;
            left -= n;
        }
        Ok(())
    }
}

/// A [`tiercache_io::Backend`] served as it is (no cache): for pass-through exports and tests.
pub struct BackendExport {
    dev: Arc<dyn Backend>,
    sizes: BlockSizes,
    stats: Option<Arc<RequestStats>>,
}

impl BackendExport {
    /// Serves `dev` with 512-byte minimum, 4 KiB preferred and 32 MiB maximum block sizes.
    pub fn new(dev: Arc<dyn Backend>) -> BackendExport {
        BackendExport {
            dev,
            sizes: BlockSizes::default(),
            stats: None,
        }
    }

    /// Counts this export's requests in `stats` ([`Export::request_stats`]).
    pub fn with_request_stats(mut self, stats: Arc<RequestStats>) -> BackendExport {
        self.stats = Some(stats);
        self
    }

    fn lba(offset: u64, len: u64) -> Result<u64, ExportError> {
        if !offset.is_multiple_of(512) || !len.is_multiple_of(512) {
            return Err(ExportError::Invalid);
        }
        Ok(offset / 512)
    }

    /// The device served.
    pub fn device(&self) -> &Arc<dyn Backend> {
        &self.dev
    }
}

impl Export for BackendExport {
    fn request_stats(&self) -> Option<&RequestStats> {
        self.stats.as_deref()
    }

    fn data_key(&self) -> (usize, u64) {
        (Arc::as_ptr(&self.dev) as *const u8 as usize, 0)
    }

    fn size(&self) -> u64 {
        self.dev.blocks() * 512
    }

    fn block_sizes(&self) -> BlockSizes {
        self.sizes
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), ExportError> {
        Ok(self.dev.read(Self::lba(offset, buf.len() as u64)?, buf)?)
    }

    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), ExportError> {
        Ok(self
            .dev
            .write(Self::lba(offset, data.len() as u64)?, data, fua)?)
    }

    fn flush(&self) -> Result<(), ExportError> {
        Ok(self.dev.flush()?)
    }

    fn trim(&self, offset: u64, len: u64) -> Result<(), ExportError> {
        Ok(self.dev.trim(Self::lba(offset, len)?, len / 512)?)
    }

    fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> Result<(), ExportError> {
        Ok(self
            .dev
            .write_zeroes(Self::lba(offset, len)?, len / 512, fua)?)
    }

    fn extents(&self, offset: u64, len: u64) -> Result<Vec<Extent>, ExportError> {
        Ok(self.dev.extents(Self::lba(offset, len)?, len / 512)?)
    }

    fn cache(&self, offset: u64, len: u64) -> Result<(), ExportError> {
        Self::lba(offset, len)?;
        if offset + len > self.size() {
            return Err(ExportError::Invalid);
        }
        Ok(())
    }
}

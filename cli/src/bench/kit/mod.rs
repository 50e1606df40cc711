//! What the benchmarks share: fio runs and their JSON ([`fio`]), child processes and Ctrl-C
//! ([`procs`]), the daemon as a child ([`daemon`]), report writing ([`report`]; the plots are
//! `crate::svg`'s, which `sim mrc` draws with too), the host ([`host`]) and summaries of
//! rounds ([`stats`]).

pub(crate) mod daemon;
pub(crate) mod fio;
pub(crate) mod host;
pub(crate) mod procs;
pub(crate) mod report;
pub(crate) mod stats;

use std::io::Write;
use std::path::Path;

/// Writes `size` bytes to `path`: pseudo-random data (seeded), or zeros (really written, so
/// nothing reads a hole).
pub(crate) fn fill_file(path: &Path, size: u64, seed: Option<u64>) -> Result<(), String> {
    let mut f = std::fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut buf = vec![0u8; 1 << 20];
    let mut x = seed.unwrap_or(0) | 1;
    let mut done = 0;
    while done < size {
        if seed.is_some() {
            for c in buf.chunks_exact_mut(8) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                c.copy_from_slice(&x.to_le_bytes());
            }
        }
        let n = (size - done).min(buf.len() as u64) as usize;
        f.write_all(&buf[..n])
            .map_err(|e| format!("{}: {e}", path.display()))?;
        done += n as u64;
    }
    f.sync_all().map_err(|e| format!("{}: {e}", path.display()))
}

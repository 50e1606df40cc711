//! The NBD wire protocol as this server speaks it: everything of [`tiercache_nbd_proto`] (the
//! constants, the request and reply codecs, the option codecs, which the fuzz targets in
//! `fuzzing/` call directly), re-exported here, and the server's checks of a request header
//! against an export ([`RequestChecks`]).

use crate::export::BlockSizes;
pub use tiercache_nbd_proto::*;

/// An answer to a request that fails its checks: `(errno, message)`.
pub type Refusal = (u32, String);

/// The server's checks of a transmission request against the export it addresses.
pub trait RequestChecks {
    /// Checks a request against an export of `size` bytes with block sizes `sizes` (for a
    /// connection that did not negotiate block sizes, the server passes a `min` of 1: any
    /// alignment), on a connection that negotiated no metadata context; `Err((errno, message))`
    /// to answer it with. `NBD_CMD_DISC` is not a request here (the caller ends the connection
    /// before checking).
    fn check(&self, size: u64, sizes: BlockSizes, read_only: bool) -> Result<(), Refusal> {
        self.check_on(size, sizes, read_only, false)
    }

    /// [`RequestChecks::check`] on a connection that negotiated `base:allocation` if
    /// `block_status` (then `NBD_CMD_BLOCK_STATUS` is a command: checked like a read, of any
    /// length but 0).
    fn check_on(&self, size: u64, s: BlockSizes, ro: bool, bs: bool) -> Result<(), Refusal>;
}

impl RequestChecks for Request {
    fn check_on(
        &self,
        size: u64,
        sizes: BlockSizes,
        read_only: bool,
        block_status: bool,
    ) -> Result<(), Refusal> {
        let r = self;
        if r.flags & !cmd::FLAGS_KNOWN != 0 {
            return Err((
                errno::EINVAL,
                format!("unknown command flags {:#x}", r.flags),
            ));
        }
        let len = r.len as u64;
        let (writes, past_end) = match r.typ {
            cmd::READ | cmd::CACHE | cmd::TRIM => (r.typ == cmd::TRIM, errno::EINVAL),
            cmd::WRITE | cmd::WRITE_ZEROES => (true, errno::ENOSPC),
            cmd::FLUSH => return Ok(()),
            cmd::BLOCK_STATUS if block_status && r.len == 0 => {
                return Err((errno::EINVAL, "NBD_CMD_BLOCK_STATUS of length 0".into()));
            }
            cmd::BLOCK_STATUS if block_status => (false, errno::EINVAL),
            cmd::BLOCK_STATUS => {
                return Err((
                    errno::EINVAL,
                    "unknown command 7: NBD_CMD_BLOCK_STATUS needs the base:allocation \
                     metadata context (NBD_OPT_SET_META_CONTEXT)"
                        .into(),
                ));
            }
            t => return Err((errno::EINVAL, format!("unknown command {t}"))),
        };
        if writes && read_only {
            return Err((errno::EPERM, "the export is read-only".into()));
        }
        // TRIM and WRITE_ZEROES carry no payload: longer ones are accepted (the export splits
        // them); CACHE is bounded like READ, as the protocol says.
        if matches!(r.typ, cmd::READ | cmd::WRITE | cmd::CACHE) && r.len > sizes.max {
            return Err((
                errno::EINVAL,
                format!(
                    "length {} is above the maximum block size {}",
                    r.len, sizes.max
                ),
            ));
        }
        let min = sizes.min as u64;
        if !r.offset.is_multiple_of(min) || !len.is_multiple_of(min) {
            return Err((
                errno::EINVAL,
                format!(
                    "offset {} / length {} not a multiple of the minimum block size {min}",
                    r.offset, len
                ),
            ));
        }
        if r.offset.checked_add(len).is_none_or(|e| e > size) {
            return Err((
                past_end,
                format!(
                    "{} bytes at offset {} go past the end of the export ({} bytes)",
                    len, r.offset, size
                ),
            ));
        }
        Ok(())
    }
}

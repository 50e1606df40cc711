use std::fmt;

/// The error of every backend operation. Its `Display` is one line.
#[derive(Debug)]
pub enum IoErr {
    /// The range `lba .. lba + blocks` does not fit in a device of `dev_blocks` blocks.
    OutOfRange {
        /// First block of the request.
        lba: u64,
        /// Length of the request in blocks.
        blocks: u64,
        /// Capacity of the device in blocks.
        dev_blocks: u64,
    },
    /// The buffer length (bytes) is not a multiple of 512.
    Misaligned {
        /// The offending length in bytes.
        len: usize,
    },
    /// The operating system reported an error.
    Io {
        /// Its kind.
        kind: std::io::ErrorKind,
        /// What failed, with the OS message.
        msg: String,
    },
    /// An error injected by [`crate::FaultBackend`].
    Injected {
        /// The operation that failed.
        op: crate::OpKind,
    },
    /// The device is off after [`crate::FaultBackend::power_cut`] until
    /// [`crate::FaultBackend::revive`].
    PoweredOff,
}

impl IoErr {
    /// Builds an [`IoErr::Io`] from an OS error and a description of what was being done.
    pub fn io(what: impl fmt::Display, e: &std::io::Error) -> Self {
        IoErr::Io {
            kind: e.kind(),
            msg: format!("{what}: {e}"),
        }
    }

    /// A device that is full (ENOSPC): an [`IoErr::Io`] of kind `StorageFull`, which the
    /// engine reports to the core as `IoError::NoSpace`.
    pub fn no_space(what: impl fmt::Display) -> Self {
        IoErr::Io {
            kind: std::io::ErrorKind::StorageFull,
            msg: format!("{what}: no space left on device"),
        }
    }

    /// A device that did not answer in time: an [`IoErr::Io`] of kind `TimedOut`, which the
    /// engine reports to the core as `IoError::TimedOut` (see [`crate::TimeoutBackend`]).
    pub fn timed_out(what: impl fmt::Display) -> Self {
        IoErr::Io {
            kind: std::io::ErrorKind::TimedOut,
            msg: format!("{what}: timed out"),
        }
    }

    /// Whether the device said it is full (ENOSPC, also as an OS error).
    pub fn is_no_space(&self) -> bool {
        matches!(self, IoErr::Io { kind, .. } if *kind == std::io::ErrorKind::StorageFull)
    }

    /// Whether the IO timed out.
    pub fn is_timed_out(&self) -> bool {
        matches!(self, IoErr::Io { kind, .. } if *kind == std::io::ErrorKind::TimedOut)
    }
}

impl fmt::Display for IoErr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IoErr::OutOfRange {
                lba,
                blocks,
                dev_blocks,
            } => write!(
                f,
                "out of range: {blocks} blocks at lba {lba} on a device of {dev_blocks} blocks"
            ),
            IoErr::Misaligned { len } => {
                write!(
                    f,
                    "misaligned: buffer of {len} bytes is not a multiple of 512"
                )
            }
            IoErr::Io { kind, msg } => write!(f, "io error ({kind:?}): {}", msg.replace('\n', " ")),
            IoErr::Injected { op } => write!(f, "injected {op:?} error"),
            IoErr::PoweredOff => write!(f, "device is powered off (power cut, not revived)"),
        }
    }
}

impl std::error::Error for IoErr {}

impl From<std::io::Error> for IoErr {
    fn from(e: std::io::Error) -> Self {
        IoErr::Io {
            kind: e.kind(),
            msg: e.to_string(),
        }
    }
}

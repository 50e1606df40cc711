use crate::{BLOCK, Backend, IoErr, check_blocks, check_bytes};
use std::sync::RwLock;

/// A volatile in-memory device. Flush is a no-op; content is lost when it is dropped.
#[derive(Debug)]
pub struct RamBackend {
    data: RwLock<Vec<u8>>,
    blocks: u64,
}

impl RamBackend {
    /// A zeroed device of `blocks` 512-byte blocks.
    pub fn new(blocks: u64) -> Self {
        let bytes = usize::try_from(blocks)
            .ok()
            .and_then(|b| b.checked_mul(BLOCK))
            .expect("RamBackend: size does not fit in memory");
        RamBackend {
            data: RwLock::new(vec![0; bytes]),
            blocks,
        }
    }

    fn range(lba: u64, blocks: u64) -> std::ops::Range<usize> {
        let start = lba as usize * BLOCK;
        start..start + blocks as usize * BLOCK
    }
}

impl Backend for RamBackend {
    fn name(&self) -> String {
        format!("ram:{} blocks (memory, volatile)", self.blocks)
    }

    fn blocks(&self) -> u64 {
        self.blocks
    }

    fn read(&self, lba: u64, buf: &mut [u8]) -> Result<(), IoErr> {
        let n = check_bytes(lba, buf.len(), self.blocks)?;
        let d = self.data.read().unwrap_or_else(|e| e.into_inner());
        buf.copy_from_slice(&d[Self::range(lba, n)]);
        Ok(())
    }

    fn write(&self, lba: u64, buf: &[u8], _fua: bool) -> Result<(), IoErr> {
        let n = check_bytes(lba, buf.len(), self.blocks)?;
        let mut d = self.data.write().unwrap_or_else(|e| e.into_inner());
        d[Self::range(lba, n)].copy_from_slice(buf);
        Ok(())
    }

    fn write_zeroes(&self, lba: u64, blocks: u64, _fua: bool) -> Result<(), IoErr> {
        check_blocks(lba, blocks, self.blocks)?;
        let mut d = self.data.write().unwrap_or_else(|e| e.into_inner());
        d[Self::range(lba, blocks)].fill(0);
        Ok(())
    }

    fn trim(&self, lba: u64, blocks: u64) -> Result<(), IoErr> {
        self.write_zeroes(lba, blocks, false)
    }

    fn flush(&self) -> Result<(), IoErr> {
        Ok(())
    }

    fn inline(&self) -> bool {
        true
    }
}

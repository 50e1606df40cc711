//! CRC32C (Castagnoli, reflected polynomial 0x82F63B78): the checksum of every record and
//! superblock. Chosen because it is what storage uses (iSCSI, ext4, Btrfs, NVMe) and has
//! hardware support we may use later without changing a byte on disk.

const POLY: u32 = 0x82f6_3b78;

const TABLE: [u32; 256] = {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 { (c >> 1) ^ POLY } else { c >> 1 };
            k += 1;
        }
        t[i] = c;
        i += 1;
    }
    t
};

/// Continues a CRC32C over `data` (start with `crc32c(0, ..)`). Uses the CPU's CRC32C
/// instruction where there is one (x86-64 with SSE4.2, aarch64 with the CRC extension: 8
/// bytes per instruction instead of one table lookup per byte, which matters when a load
/// checks hundreds of MiB of checkpoint and when mode `wl` checksums every client write), a
/// table otherwise; same result.
pub fn crc32c_update(crc: u32, data: &[u8]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("sse4.2") {
            // SAFETY: the CPU supports SSE4.2, checked just above.
            return unsafe { crc32c_sse42(crc, data) };
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        if std::arch::is_aarch64_feature_detected!("crc") {
            // SAFETY: the CPU has the CRC extension, checked just above.
            return unsafe { crc32c_arm(crc, data) };
        }
    }
    crc32c_table(crc, data)
}

/// Whether [`crc32c_update`] uses the CPU's CRC32C instruction on this machine.
pub fn hardware() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("sse4.2")
    }
    #[cfg(target_arch = "aarch64")]
    {
        std::arch::is_aarch64_feature_detected!("crc")
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        false
    }
}

fn crc32c_table(crc: u32, data: &[u8]) -> u32 {
    let mut c = !crc;
    for &b in data {
        c = TABLE[((c ^ b as u32) & 0xff) as usize] ^ (c >> 8);
    }
    !c
}

/// # Safety
/// The CPU must support SSE4.2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.2")]
unsafe fn crc32c_sse42(crc: u32, data: &[u8]) -> u32 {
    use std::arch::x86_64::{_mm_crc32_u8, _mm_crc32_u64};
    let mut c = !crc as u64;
    let mut chunks = data.chunks_exact(8);
    for w in &mut chunks {
        let v = u64::from_le_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]]);
        c = _mm_crc32_u64(c, v);
    }
    let mut c = c as u32;
    for &b in chunks.remainder() {
        c = _mm_crc32_u8(c, b);
    }
    !c
}

/// # Safety
/// The CPU must have the CRC extension (`FEAT_CRC32`).
#[cfg(target_arch = "aarch64")]
#[target_feature(enable = "crc")]
unsafe fn crc32c_arm(crc: u32, data: &[u8]) -> u32 {
    use std::arch::aarch64::{__crc32cb, __crc32cd};
    let mut c = !crc;
    let mut chunks = data.chunks_exact(8);
    for w in &mut chunks {
        let v = u64::from_le_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]]);
        c = __crc32cd(c, v);
    }
    for &b in chunks.remainder() {
        c = __crc32cb(c, b);
    }
    !c
}

/// CRC32C of `data`.
pub fn crc32c(data: &[u8]) -> u32 {
    crc32c_update(0, data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_vectors() {
        // RFC 3720 (iSCSI) appendix B.4 and the common check value.
        assert_eq!(crc32c(b"123456789"), 0xe306_9283);
        assert_eq!(crc32c(&[0u8; 32]), 0x8a91_36aa);
        assert_eq!(crc32c(&[0xffu8; 32]), 0x62a8_ab43);
        let inc: Vec<u8> = (0..32).collect();
        assert_eq!(crc32c(&inc), 0x46dd_794e);
        assert_eq!(
            crc32c_update(crc32c(b"1234"), b"56789"),
            crc32c(b"123456789")
        );
    }

    /// On x86-64 and aarch64 build machines the hardware path is the one under test here.
    #[test]
    fn hardware_and_table_agree() {
        #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
        eprintln!("hardware CRC32C: {}", hardware());
        let data: Vec<u8> = (0..5000u32)
            .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
            .collect();
        for len in [0, 1, 7, 8, 9, 63, 64, 65, 4096, 4990] {
            for start in [0, 1, 3] {
                let d = &data[start..start + len];
                assert_eq!(
                    crc32c_update(0x1234, d),
                    crc32c_table(0x1234, d),
                    "len {len}"
                );
            }
        }
    }
}

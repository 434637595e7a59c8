//! CRC-32C (Castagnoli), table-driven, and the "masked" form TFRecord framing stores.
//!
//! Written here instead of pulled in as a crate: it is 30 lines, and TensorBoard's reader
//! rejects a record whose masked checksum is wrong, so the known-vector tests below pin it.

/// Reflected Castagnoli polynomial.
const POLY: u32 = 0x82F6_3B78;

/// The 256-entry lookup table, built at compile time.
const TABLE: [u32; 256] = build_table();

const fn build_table() -> [u32; 256] {
    let mut table = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = i as u32;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 1 != 0 { (crc >> 1) ^ POLY } else { crc >> 1 };
            bit += 1;
        }
        table[i] = crc;
        i += 1;
    }
    table
}

/// CRC-32C of `data` (initial value and final xor `0xFFFF_FFFF`, as iSCSI and TFRecord use).
pub fn crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc = TABLE[((crc ^ b as u32) & 0xFF) as usize] ^ (crc >> 8);
    }
    !crc
}

/// TFRecord's masked CRC, `((crc >> 15) | (crc << 17)) + 0xa282ead8`: rotate right by 15 and
/// add a constant, so a CRC stored inside
/// CRC'd data does not checksum to a fixed pattern.
pub fn masked_crc32c(data: &[u8]) -> u32 {
    let crc = crc32c(data);
    crc.rotate_right(15).wrapping_add(0xA282_EAD8)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bitwise reference (no table) to check the table against.
    fn crc32c_bitwise(data: &[u8]) -> u32 {
        let mut crc = !0u32;
        for &b in data {
            crc ^= b as u32;
            for _ in 0..8 {
                crc = if crc & 1 != 0 { (crc >> 1) ^ POLY } else { crc >> 1 };
            }
        }
        !crc
    }

    #[test]
    fn known_vectors() {
        // The standard check value of CRC-32C.
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(crc32c(b""), 0);
        // RFC 3720 (iSCSI) B.4 test vectors.
        assert_eq!(crc32c(&[0u8; 32]), 0x8A91_36AA);
        assert_eq!(crc32c(&[0xFFu8; 32]), 0x62A8_AB43);
        let ascending: Vec<u8> = (0u8..32).collect();
        assert_eq!(crc32c(&ascending), 0x46DD_794E);
    }

    #[test]
    fn table_matches_bitwise_reference() {
        let data: Vec<u8> = (0..1000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        for len in [0, 1, 7, 64, 1000] {
            assert_eq!(crc32c(&data[..len]), crc32c_bitwise(&data[..len]), "length {len}");
        }
    }

    #[test]
    fn mask_formula() {
        // ((0xE3069283 >> 15) | (0xE3069283 << 17)) + 0xa282ead8 mod 2^32, computed independently.
        assert_eq!(masked_crc32c(b"123456789"), 0xC78A_B0E5);
    }
}

//! TFRecord framing, the container of TensorBoard event files.
//!
//! Each record is `u64 length (LE) | u32 masked_crc32c(length bytes) | data |
//! u32 masked_crc32c(data)`. The reader checks both checksums so tests (and tools) catch a
//! writer bug the way TensorBoard would.

use crate::crc32c::masked_crc32c;
use anyhow::{bail, Result};
use std::io::Write;

/// Appends one framed record holding `data`.
pub fn write_record(w: &mut impl Write, data: &[u8]) -> std::io::Result<()> {
    let len = (data.len() as u64).to_le_bytes();
    w.write_all(&len)?;
    w.write_all(&masked_crc32c(&len).to_le_bytes())?;
    w.write_all(data)?;
    w.write_all(&masked_crc32c(data).to_le_bytes())
}

/// Splits a whole file into record payloads; errors name the byte offset and what is wrong.
pub fn read_records(bytes: &[u8]) -> Result<Vec<Vec<u8>>> {
    let mut out = Vec::new();
    let mut pos = 0usize;
    while pos < bytes.len() {
        let header = take(bytes, pos, 12, "record header")?;
        let len_bytes: [u8; 8] = header[..8].try_into()?;
        let stored = u32::from_le_bytes(header[8..12].try_into()?);
        if stored != masked_crc32c(&len_bytes) {
            bail!("record at byte {pos}: length checksum mismatch (corrupted or not a TFRecord file)");
        }
        let len = usize::try_from(u64::from_le_bytes(len_bytes))?;
        let data = take(bytes, pos + 12, len, "record data")?;
        let crc = u32::from_le_bytes(take(bytes, pos + 12 + len, 4, "record data checksum")?.try_into()?);
        if crc != masked_crc32c(data) {
            bail!("record at byte {pos}: data checksum mismatch (corrupted record of {len} bytes)");
        }
        out.push(data.to_vec());
        pos += 12 + len + 4;
    }
    Ok(out)
}

fn take<'a>(bytes: &'a [u8], start: usize, len: usize, what: &str) -> Result<&'a [u8]> {
    match start.checked_add(len) {
        Some(end) if end <= bytes.len() => Ok(&bytes[start..end]),
        _ => bail!("truncated TFRecord: {what} at byte {start} needs {len} bytes, file has {}", bytes.len()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_corruption() {
        let mut buf = Vec::new();
        write_record(&mut buf, b"hello").unwrap();
        write_record(&mut buf, b"").unwrap();
        assert_eq!(buf.len(), (12 + 5 + 4) + (12 + 4));
        assert_eq!(read_records(&buf).unwrap(), vec![b"hello".to_vec(), Vec::new()]);

        let mut flipped = buf.clone();
        flipped[13] ^= 1;
        let err = read_records(&flipped).unwrap_err().to_string();
        assert!(err.contains("data checksum"), "{err}");

        let err = read_records(&buf[..buf.len() - 3]).unwrap_err().to_string();
        assert!(err.contains("truncated"), "{err}");
    }
}

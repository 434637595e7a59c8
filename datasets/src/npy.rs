//! numpy's `.npy` format for the integer index arrays of the dataset cache (SPEC §2.5). The
//! writer produces the bytes `numpy.save` does (format 1.0, the 64-byte-aligned header with
//! numpy's spare growth space), so Megatron's `numpy.load` reads our caches and we read its
//! caches; the reader accepts format 1.0–3.0 and checks that the file size matches the header.

use anyhow::{anyhow, bail, Context};
use megatron_core::Result;
use std::fs::File;
use std::io::Write;
use std::path::Path;

const MAGIC: &[u8; 6] = b"\x93NUMPY";
/// numpy's `ARRAY_ALIGN`.
const ALIGN: usize = 64;
/// numpy's `GROWTH_AXIS_MAX_DIGITS`: spare header room so the first axis can grow in place.
const GROWTH_AXIS_MAX_DIGITS: usize = 21;

/// The little-endian integer dtypes the dataset indices use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NpyDType {
    I16,
    I32,
    U32,
    I64,
}

impl NpyDType {
    /// numpy's `descr` string.
    pub fn descr(self) -> &'static str {
        match self {
            NpyDType::I16 => "<i2",
            NpyDType::I32 => "<i4",
            NpyDType::U32 => "<u4",
            NpyDType::I64 => "<i8",
        }
    }

    pub fn itemsize(self) -> usize {
        match self {
            NpyDType::I16 => 2,
            NpyDType::I32 | NpyDType::U32 => 4,
            NpyDType::I64 => 8,
        }
    }

    fn from_descr(descr: &str) -> Option<NpyDType> {
        [NpyDType::I16, NpyDType::I32, NpyDType::U32, NpyDType::I64].into_iter().find(|d| d.descr() == descr)
    }

    /// Whether `v` is representable.
    fn holds(self, v: i64) -> bool {
        match self {
            NpyDType::I16 => i16::try_from(v).is_ok(),
            NpyDType::I32 => i32::try_from(v).is_ok(),
            NpyDType::U32 => u32::try_from(v).is_ok(),
            NpyDType::I64 => true,
        }
    }
}

/// An integer array in C order; values are widened to `i64` in memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NpyArray {
    pub dtype: NpyDType,
    pub shape: Vec<usize>,
    pub data: Vec<i64>,
}

impl NpyArray {
    pub fn new(dtype: NpyDType, shape: Vec<usize>, data: Vec<i64>) -> Result<NpyArray> {
        let n: usize = shape.iter().product();
        if n != data.len() {
            bail!("an array of shape {shape:?} needs {n} values, got {}", data.len());
        }
        if let Some(v) = data.iter().find(|&&v| !dtype.holds(v)) {
            bail!("value {v} does not fit the array's dtype {}", dtype.descr());
        }
        Ok(NpyArray { dtype, shape, data })
    }

    /// The header numpy writes: the dict literal, growth spaces, alignment padding, newline.
    fn header(&self) -> Vec<u8> {
        let shape = match self.shape.as_slice() {
            [n] => format!("({n},)"),
            dims => format!("({})", dims.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ")),
        };
        let mut text = format!("{{'descr': '{}', 'fortran_order': False, 'shape': {shape}, }}", self.dtype.descr());
        if let Some(first) = self.shape.first() {
            text.extend(std::iter::repeat_n(' ', GROWTH_AXIS_MAX_DIGITS.saturating_sub(first.to_string().len())));
        }
        let hlen = text.len() + 1;
        let padlen = ALIGN - ((MAGIC.len() + 2 + 2 + hlen) % ALIGN);
        text.extend(std::iter::repeat_n(' ', padlen));
        text.push('\n');
        let mut out = MAGIC.to_vec();
        out.extend_from_slice(&[1, 0]);
        out.extend_from_slice(&(text.len() as u16).to_le_bytes());
        out.extend_from_slice(text.as_bytes());
        out
    }

    /// The complete file content.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = self.header();
        out.reserve(self.data.len() * self.dtype.itemsize());
        for &v in &self.data {
            // `new` checked the range, so the truncating casts are exact.
            match self.dtype {
                NpyDType::I16 => out.extend_from_slice(&(v as i16).to_le_bytes()),
                NpyDType::I32 => out.extend_from_slice(&(v as i32).to_le_bytes()),
                NpyDType::U32 => out.extend_from_slice(&(v as u32).to_le_bytes()),
                NpyDType::I64 => out.extend_from_slice(&v.to_le_bytes()),
            }
        }
        out
    }

    /// Parses a whole `.npy` file; `what` names it in errors.
    pub fn from_bytes(bytes: &[u8], what: &str) -> Result<NpyArray> {
        if bytes.len() < 10 || &bytes[..6] != MAGIC {
            bail!("{what}: not a .npy file (bad magic)");
        }
        let (major, minor) = (bytes[6], bytes[7]);
        let (hlen, start) = match (major, minor) {
            (1, 0) => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
            (2 | 3, 0) if bytes.len() >= 12 => {
                (u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize, 12)
            }
            _ => bail!("{what}: unsupported .npy format version {major}.{minor}"),
        };
        let header = bytes.get(start..start + hlen).ok_or_else(|| anyhow!("{what}: truncated .npy header"))?;
        let header = std::str::from_utf8(header).map_err(|_| anyhow!("{what}: the .npy header is not text"))?;
        let descr = dict_value(header, "descr").ok_or_else(|| anyhow!("{what}: the .npy header has no 'descr'"))?;
        let descr = descr.trim_matches(|c| c == '\'' || c == '"');
        let dtype = NpyDType::from_descr(descr)
            .ok_or_else(|| anyhow!("{what}: dtype {descr:?} is not one of <i2, <i4, <u4, <i8"))?;
        let shape_text =
            dict_value(header, "shape").ok_or_else(|| anyhow!("{what}: the .npy header has no 'shape'"))?;
        let shape: Vec<usize> = shape_text
            .trim_matches(|c| c == '(' || c == ')')
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| s.parse().map_err(|_| anyhow!("{what}: bad .npy shape {shape_text:?}")))
            .collect::<Result<_>>()?;
        let fortran = dict_value(header, "fortran_order").unwrap_or("False");
        if fortran == "True" && shape.len() > 1 {
            bail!("{what}: Fortran-ordered arrays are not supported");
        }
        let count: usize = shape.iter().product();
        let body = &bytes[start + hlen..];
        if body.len() != count * dtype.itemsize() {
            bail!(
                "{what}: the header promises {count} values of {} ({} bytes) but the file holds {} data bytes \
                 (truncated or corrupt)",
                dtype.descr(),
                count * dtype.itemsize(),
                body.len()
            );
        }
        let data = body
            .chunks_exact(dtype.itemsize())
            .map(|c| match dtype {
                NpyDType::I16 => i64::from(i16::from_le_bytes([c[0], c[1]])),
                NpyDType::I32 => i64::from(i32::from_le_bytes([c[0], c[1], c[2], c[3]])),
                NpyDType::U32 => i64::from(u32::from_le_bytes([c[0], c[1], c[2], c[3]])),
                NpyDType::I64 => i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]),
            })
            .collect();
        Ok(NpyArray { dtype, shape, data })
    }
}

/// The raw value text of `'key': value` in the header's dict literal (tuples kept whole).
fn dict_value<'a>(header: &'a str, key: &str) -> Option<&'a str> {
    let pat = format!("'{key}':");
    let rest = header[header.find(&pat)? + pat.len()..].trim_start();
    let end = if rest.starts_with('(') { rest.find(')')? + 1 } else { rest.find([',', '}'])? };
    Some(rest[..end].trim())
}

/// Reads `path`.
pub fn read_npy(path: &Path) -> Result<NpyArray> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read `{}`", path.display()))?;
    NpyArray::from_bytes(&bytes, &path.display().to_string())
}

/// Writes `bytes` to `path` atomically: a unique temporary file in the same directory, fsync,
/// rename. Readers never see a half-written file under the real name.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let unique = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.tmp.{}.{unique}", std::process::id()));
    let result = (|| -> Result<()> {
        let mut f = File::create(&tmp).with_context(|| format!("cannot create `{}`", tmp.display()))?;
        f.write_all(bytes).with_context(|| format!("cannot write `{}`", tmp.display()))?;
        f.sync_all().with_context(|| format!("cannot fsync `{}`", tmp.display()))?;
        std::fs::rename(&tmp, path)
            .with_context(|| format!("cannot rename `{}` to `{}`", tmp.display(), path.display()))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Writes `array` to `path` atomically.
pub fn write_npy(path: &Path, array: &NpyArray) -> Result<()> {
    write_atomic(path, &array.to_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_is_numpys_and_round_trips() -> Result<()> {
        let a = NpyArray::new(NpyDType::I32, vec![3, 2], vec![0, 0, 1, 4, -2, 7])?;
        let bytes = a.to_bytes();
        // numpy.save(numpy.zeros((3, 2), numpy.int32)) writes a 128-byte header:
        let want_text = "{'descr': '<i4', 'fortran_order': False, 'shape': (3, 2), }";
        assert_eq!(&bytes[..10], b"\x93NUMPY\x01\x00\x76\x00");
        assert_eq!(&bytes[10..10 + want_text.len()], want_text.as_bytes());
        assert_eq!(bytes.len(), 128 + 6 * 4);
        assert_eq!(bytes[127], b'\n');
        assert!(bytes[10 + want_text.len()..127].iter().all(|&b| b == b' '));
        assert_eq!(NpyArray::from_bytes(&bytes, "t")?, a);

        let b = NpyArray::new(NpyDType::U32, vec![5], vec![4, 3, 2, 1, u32::MAX as i64])?;
        let bytes = b.to_bytes();
        assert!(
            bytes.starts_with(b"\x93NUMPY\x01\x00\x76\x00{'descr': '<u4', 'fortran_order': False, 'shape': (5,), }")
        );
        assert_eq!(bytes.len() % 4, 0);
        assert_eq!(NpyArray::from_bytes(&bytes, "t")?, b);
        Ok(())
    }

    #[test]
    fn damaged_files_and_bad_values_are_errors() -> Result<()> {
        let a = NpyArray::new(NpyDType::I64, vec![4], vec![1, 2, 3, 4])?;
        let bytes = a.to_bytes();
        let err = NpyArray::from_bytes(&bytes[..bytes.len() - 1], "x.npy").err().map(|e| e.to_string());
        assert!(err.is_some_and(|e| e.contains("x.npy") && e.contains("truncated")));
        let mut forged = bytes.clone();
        forged[0] = b'X';
        assert!(NpyArray::from_bytes(&forged, "x").is_err());
        let mut wrong_dtype = bytes;
        let at = wrong_dtype.windows(3).position(|w| w == b"<i8").unwrap_or(0);
        wrong_dtype[at + 1] = b'f';
        assert!(NpyArray::from_bytes(&wrong_dtype, "x").is_err());
        assert!(NpyArray::new(NpyDType::I16, vec![1], vec![40_000]).is_err());
        assert!(NpyArray::new(NpyDType::I32, vec![2, 2], vec![1]).is_err());
        Ok(())
    }
}

//! The GGUF container (versions 2 and 3): `"GGUF"`, version u32, tensor count u64, metadata
//! count u64, the metadata key/values, the tensor infos (name, dims with the fastest first,
//! type, offset), then the tensor data from the next multiple of `general.alignment` (32 by
//! default). All integers little-endian.

use crate::dequant::{dequantize, GgmlType};
use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;
use std::path::Path;

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum GgufValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(Vec<GgufValue>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl GgufValue {
    /// Any integer type as u64 (negative values are `None`).
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            GgufValue::U8(v) => Some(v as u64),
            GgufValue::U16(v) => Some(v as u64),
            GgufValue::U32(v) => Some(v as u64),
            GgufValue::U64(v) => Some(v),
            GgufValue::I8(v) => u64::try_from(v).ok(),
            GgufValue::I16(v) => u64::try_from(v).ok(),
            GgufValue::I32(v) => u64::try_from(v).ok(),
            GgufValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            GgufValue::F32(v) => Some(v as f64),
            GgufValue::F64(v) => Some(v),
            _ => self.as_u64().map(|v| v as f64),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            GgufValue::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[GgufValue]> {
        match self {
            GgufValue::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// One tensor's description. `dims` are GGUF's order (fastest first): a `[out, in]` row-major
/// weight has `dims = [in, out]`.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
    /// Byte offset from the start of the data section.
    pub offset: u64,
    /// Bytes of this tensor's data.
    pub size: usize,
}

impl TensorInfo {
    pub fn numel(&self) -> usize {
        self.dims.iter().product::<u64>() as usize
    }

    /// Row-major shape (slowest first), e.g. `[out, in]`.
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }
}

/// A parsed GGUF file held in memory.
pub struct GgufFile {
    pub version: u32,
    pub metadata: BTreeMap<String, GgufValue>,
    pub tensors: Vec<TensorInfo>,
    pub alignment: usize,
    data: Vec<u8>,
    data_start: usize,
    origin: String,
}

/// A cursor that fails (with the offset) instead of reading past the end.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len());
        let Some(end) = end else {
            bail!(
                "truncated at byte {}: {what} needs {n} bytes but only {} remain",
                self.pos,
                self.buf.len() - self.pos
            );
        };
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn arr<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        Ok(self.take(N, what)?.try_into().expect("take returned N bytes"))
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.arr(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.arr(what)?))
    }

    /// A count of items of at least `min_item` bytes each, checked against the bytes left.
    fn count(&mut self, what: &str, min_item: usize) -> Result<usize> {
        let at = self.pos;
        let n = self.u64(what)?;
        let left = (self.buf.len() - self.pos) as u64;
        if n.saturating_mul(min_item.max(1) as u64) > left {
            bail!("byte {at}: {what} = {n} cannot fit in the {left} bytes left (corrupt or truncated file)");
        }
        Ok(n as usize)
    }

    fn string(&mut self, what: &str) -> Result<String> {
        let n = self.count(what, 1)?;
        let at = self.pos;
        let bytes = self.take(n, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| anyhow::anyhow!("byte {at}: {what} is not valid UTF-8"))
    }

    fn value(&mut self, ty: u32, key: &str, depth: usize) -> Result<GgufValue> {
        let w = format!("value of `{key}`");
        Ok(match ty {
            0 => GgufValue::U8(self.arr::<1>(&w)?[0]),
            1 => GgufValue::I8(self.arr::<1>(&w)?[0] as i8),
            2 => GgufValue::U16(u16::from_le_bytes(self.arr(&w)?)),
            3 => GgufValue::I16(i16::from_le_bytes(self.arr(&w)?)),
            4 => GgufValue::U32(self.u32(&w)?),
            5 => GgufValue::I32(i32::from_le_bytes(self.arr(&w)?)),
            6 => GgufValue::F32(f32::from_le_bytes(self.arr(&w)?)),
            7 => match self.arr::<1>(&w)?[0] {
                0 => GgufValue::Bool(false),
                1 => GgufValue::Bool(true),
                b => bail!("byte {}: bool `{key}` is {b}, not 0 or 1", self.pos - 1),
            },
            8 => GgufValue::String(self.string(&w)?),
            9 => {
                if depth > 2 {
                    bail!("byte {}: arrays of `{key}` nest deeper than 2", self.pos);
                }
                let item = self.u32(&format!("array item type of `{key}`"))?;
                let min = match item {
                    0 | 1 | 7 => 1,
                    2 | 3 => 2,
                    4..=6 => 4,
                    8..=12 => 8,
                    t => bail!("byte {}: array `{key}` has unknown item type {t}", self.pos - 4),
                };
                let n = self.count(&format!("length of array `{key}`"), min)?;
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.value(item, key, depth + 1)?);
                }
                GgufValue::Array(v)
            }
            10 => GgufValue::U64(self.u64(&w)?),
            11 => GgufValue::I64(i64::from_le_bytes(self.arr(&w)?)),
            12 => GgufValue::F64(f64::from_le_bytes(self.arr(&w)?)),
            t => bail!("byte {}: metadata `{key}` has unknown value type {t}", self.pos - 4),
        })
    }
}

impl GgufFile {
    /// Reads and parses `path`.
    pub fn open(path: &Path) -> Result<GgufFile> {
        let data = std::fs::read(path).with_context(|| format!("reading GGUF file {}", path.display()))?;
        GgufFile::parse(data, &path.display().to_string())
    }

    /// Parses a whole GGUF file held in `data`; `origin` names it in errors.
    pub fn parse(data: Vec<u8>, origin: &str) -> Result<GgufFile> {
        let (version, metadata, tensors, alignment, data_start) =
            Self::parse_header(&data).with_context(|| format!("{origin} is not a valid GGUF file"))?;
        Ok(GgufFile { version, metadata, tensors, alignment, data, data_start, origin: origin.to_string() })
    }

    #[allow(clippy::type_complexity)]
    fn parse_header(buf: &[u8]) -> Result<(u32, BTreeMap<String, GgufValue>, Vec<TensorInfo>, usize, usize)> {
        let mut c = Cursor { buf, pos: 0 };
        let magic = c.arr::<4>("the magic")?;
        if &magic != b"GGUF" {
            bail!("the magic is {magic:?}, not \"GGUF\"");
        }
        let version = c.u32("the version")?;
        if !(2..=3).contains(&version) {
            bail!("GGUF version {version} is not supported (2 and 3 are)");
        }
        // A tensor info is at least 8 (name) + 4 + 4 + 8 bytes; a key/value at least 8 + 4 + 1.
        let n_tensors = c.count("the tensor count", 24)?;
        let n_kv = c.count("the metadata count", 13)?;
        let mut metadata = BTreeMap::new();
        for i in 0..n_kv {
            let key = c.string(&format!("the key of metadata entry {i}"))?;
            let ty = c.u32(&format!("the type of `{key}`"))?;
            let v = c.value(ty, &key, 0)?;
            if metadata.insert(key.clone(), v).is_some() {
                bail!("metadata key `{key}` appears twice");
            }
        }
        let alignment = match metadata.get("general.alignment") {
            None => 32,
            Some(v) => match v.as_u64() {
                Some(a) if a > 0 && a.is_power_of_two() && a <= 1 << 20 => a as usize,
                _ => bail!("general.alignment {v:?} is not a power of two <= 1 MiB"),
            },
        };
        let mut tensors = Vec::with_capacity(n_tensors);
        for i in 0..n_tensors {
            let name = c.string(&format!("the name of tensor {i}"))?;
            let n_dims = c.u32(&format!("the rank of `{name}`"))?;
            if n_dims == 0 || n_dims > 4 {
                bail!("tensor `{name}` has {n_dims} dims; GGUF tensors have 1 to 4");
            }
            let mut dims = Vec::new();
            let mut numel: u64 = 1;
            for _ in 0..n_dims {
                let d = c.u64(&format!("a dim of `{name}`"))?;
                numel = numel.checked_mul(d).filter(|&n| n <= buf.len() as u64 * 8).with_context(|| {
                    format!("tensor `{name}` dims {dims:?}.. claim more elements than the file holds")
                })?;
                dims.push(d);
            }
            let ty_raw = c.u32(&format!("the type of `{name}`"))?;
            let ggml_type =
                GgmlType::from_id(ty_raw).with_context(|| format!("tensor `{name}` has ggml type {ty_raw}"))?;
            let offset = c.u64(&format!("the offset of `{name}`"))?;
            let size = ggml_type
                .byte_size(numel as usize, dims[0] as usize)
                .with_context(|| format!("tensor `{name}` of shape {dims:?}"))?;
            if offset % alignment as u64 != 0 {
                bail!("tensor `{name}` offset {offset} is not a multiple of the alignment {alignment}");
            }
            tensors.push(TensorInfo { name, dims, ggml_type, offset, size });
        }
        let data_start = c.pos.div_ceil(alignment) * alignment;
        let data_len = buf.len().saturating_sub(data_start) as u64;
        for t in &tensors {
            if t.offset.saturating_add(t.size as u64) > data_len {
                bail!(
                    "tensor `{}` ({:?}, {} bytes at data offset {}) runs past the end of the file ({data_len} data bytes): \
                     the file is truncated",
                    t.name,
                    t.ggml_type,
                    t.size,
                    t.offset
                );
            }
        }
        Ok((version, metadata, tensors, alignment, data_start))
    }

    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.metadata.get(key)
    }

    /// A required metadata integer.
    pub fn u64(&self, key: &str) -> Result<u64> {
        self.get(key).and_then(|v| v.as_u64()).with_context(|| format!("{}: no integer metadata `{key}`", self.origin))
    }

    /// A required metadata number.
    pub fn f64(&self, key: &str) -> Result<f64> {
        self.get(key).and_then(|v| v.as_f64()).with_context(|| format!("{}: no numeric metadata `{key}`", self.origin))
    }

    /// A required metadata string.
    pub fn str(&self, key: &str) -> Result<&str> {
        self.get(key).and_then(|v| v.as_str()).with_context(|| format!("{}: no string metadata `{key}`", self.origin))
    }

    /// A metadata array of strings.
    pub fn strings(&self, key: &str) -> Result<Vec<&str>> {
        let a =
            self.get(key).and_then(|v| v.as_array()).with_context(|| format!("{}: no array `{key}`", self.origin))?;
        a.iter()
            .enumerate()
            .map(|(i, v)| v.as_str().with_context(|| format!("{}: `{key}`[{i}] is not a string", self.origin)))
            .collect()
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The raw bytes of a tensor.
    pub fn raw(&self, t: &TensorInfo) -> &[u8] {
        let start = self.data_start + t.offset as usize;
        &self.data[start..start + t.size]
    }

    /// A tensor dequantized to f32, row-major with shape [`TensorInfo::shape`].
    pub fn read_f32(&self, name: &str) -> Result<(Vec<f32>, Vec<usize>)> {
        let t = self.tensor(name).with_context(|| format!("{} has no tensor `{name}`", self.origin))?;
        let data = dequantize(t.ggml_type, self.raw(t), t.numel())
            .with_context(|| format!("{}: dequantizing `{name}`", self.origin))?;
        Ok((data, t.shape()))
    }
}

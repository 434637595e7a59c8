//! Reading `torch.save` files: a zip archive (`<name>/data.pkl`, `<name>/data/<key>` raw
//! little-endian storages, `<name>/byteorder`, `<name>/version`) decoded with the safe
//! unpickler. Tensors are references until [`TorchFile::tensor`] reads their bytes, checking
//! the view (offset, shape, stride) against the storage's real size first.

use crate::pickle::unpickle;
use crate::value::{TensorRef, TorchDType, Value};
use anyhow::{anyhow, bail, Context, Result};
use half::{bf16, f16};
use std::cell::RefCell;
use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Seek};
use std::path::{Path, PathBuf};

/// Largest `data.pkl` we decode (real ones are a few hundred KiB).
const MAX_PICKLE_BYTES: u64 = 1 << 30;

/// A tensor's elements, contiguous and row-major, in its stored dtype.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorData {
    pub dtype: TorchDType,
    pub shape: Vec<usize>,
    /// Little-endian element bytes.
    pub bytes: Vec<u8>,
}

impl TensorData {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// The elements as f32 (floats widened or narrowed as torch's `.float()`, ints converted).
    pub fn to_f32(&self) -> Vec<f32> {
        let b = &self.bytes;
        match self.dtype {
            TorchDType::F32 => b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
            TorchDType::F64 => b.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().expect("8")) as f32).collect(),
            TorchDType::F16 => b.chunks_exact(2).map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
            TorchDType::BF16 => b.chunks_exact(2).map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
            TorchDType::I64 => b.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().expect("8")) as f32).collect(),
            TorchDType::I32 => b.chunks_exact(4).map(|c| i32::from_le_bytes(c.try_into().expect("4")) as f32).collect(),
            TorchDType::I16 => b.chunks_exact(2).map(|c| i16::from_le_bytes([c[0], c[1]]) as f32).collect(),
            TorchDType::I8 => b.iter().map(|&x| x as i8 as f32).collect(),
            TorchDType::U8 | TorchDType::Bool => b.iter().map(|&x| x as f32).collect(),
        }
    }
}

/// What a [`TorchFile`] reads from: a file, or bytes held in memory (a `.distcp` item).
trait ReadSeek: Read + Seek {}
impl<T: Read + Seek> ReadSeek for T {}

/// An opened `torch.save` archive and its decoded pickle.
pub struct TorchFile {
    path: PathBuf,
    archive: RefCell<zip::ZipArchive<Box<dyn ReadSeek>>>,
    prefix: String,
    file_len: u64,
    pub root: Value,
    storage_sizes: HashMap<String, u64>,
}

fn read_entry<R: Read + Seek>(
    archive: &mut zip::ZipArchive<R>,
    name: &str,
    limit: u64,
    path: &Path,
) -> Result<Vec<u8>> {
    let mut entry = archive.by_name(name).map_err(|e| anyhow!("{}: cannot open `{name}`: {e}", path.display()))?;
    let size = entry.size();
    if size > limit {
        bail!("{}: `{name}` claims {size} bytes, more than the {limit} this file can hold", path.display());
    }
    let mut out = Vec::with_capacity(size as usize);
    (&mut entry)
        .take(limit)
        .read_to_end(&mut out)
        .map_err(|e| anyhow!("{}: reading `{name}` failed (truncated or corrupted archive): {e}", path.display()))?;
    if out.len() as u64 != size {
        bail!("{}: `{name}` is {} bytes, its header says {size}", path.display(), out.len());
    }
    Ok(out)
}

impl TorchFile {
    /// Opens and decodes `path`. Errors name the file: not a zip (old non-zip `torch.save`
    /// files are refused), no `data.pkl`, big-endian data, a refused global, a truncated pickle.
    pub fn open(path: &Path) -> Result<TorchFile> {
        let file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
        let file_len = file.metadata().with_context(|| format!("cannot stat {}", path.display()))?.len();
        Self::from_reader(Box::new(file), file_len, path)
    }

    /// Decodes a `torch.save` archive held in memory; `source` names it in errors.
    pub fn from_bytes(bytes: Vec<u8>, source: &Path) -> Result<TorchFile> {
        let len = bytes.len() as u64;
        Self::from_reader(Box::new(std::io::Cursor::new(bytes)), len, source)
    }

    fn from_reader(reader: Box<dyn ReadSeek>, file_len: u64, path: &Path) -> Result<TorchFile> {
        let mut archive = zip::ZipArchive::new(reader).map_err(|e| {
            anyhow!(
                "{} is not a PyTorch zip checkpoint ({e}); files from torch < 1.6 \
                 (`_use_new_zipfile_serialization=False`) must be re-saved with a current torch",
                path.display()
            )
        })?;
        let names: Vec<String> = archive.file_names().map(str::to_string).collect();
        let pkl = names
            .iter()
            .filter(|n| n.ends_with("data.pkl") && n.matches('/').count() <= 1)
            .min_by_key(|n| n.len())
            .ok_or_else(|| anyhow!("{}: the archive has no data.pkl (not a torch.save file)", path.display()))?
            .clone();
        let prefix = pkl[..pkl.len() - "data.pkl".len()].to_string();
        if names.contains(&format!("{prefix}byteorder")) {
            let order = read_entry(&mut archive, &format!("{prefix}byteorder"), 16, path)?;
            if order != b"little" {
                bail!("{}: big-endian storages are not supported", path.display());
            }
        }
        let mut storage_sizes = HashMap::new();
        let data_prefix = format!("{prefix}data/");
        for i in 0..archive.len() {
            let entry =
                archive.by_index_raw(i).map_err(|e| anyhow!("{}: corrupted zip entry {i}: {e}", path.display()))?;
            if let Some(key) = entry.name().strip_prefix(&data_prefix) {
                storage_sizes.insert(key.to_string(), entry.size());
            }
        }
        let bytes = read_entry(&mut archive, &pkl, MAX_PICKLE_BYTES.min(file_len), path)?;
        let root = unpickle(&bytes, &format!("{} ({pkl})", path.display()))?;
        Ok(TorchFile {
            path: path.to_path_buf(),
            archive: RefCell::new(archive),
            prefix,
            file_len,
            root,
            storage_sizes,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The elements of `t` (named `name` in errors), contiguous. The view must lie inside its
    /// storage, and the storage entry must hold exactly the elements the pickle declares.
    pub fn tensor(&self, t: &TensorRef, name: &str) -> Result<TensorData> {
        let p = self.path.display();
        let el = t.storage.dtype.size() as u64;
        let key = &t.storage.key;
        let stored = *self.storage_sizes.get(key).ok_or_else(|| {
            anyhow!("{p}: tensor `{name}` uses storage data/{key}, which the archive lacks (truncated file?)")
        })?;
        let declared = t.storage.numel.checked_mul(el);
        if declared != Some(stored) {
            bail!("{p}: tensor `{name}`: storage data/{key} is {stored} bytes, the pickle declares {} elements of {el} bytes", t.storage.numel);
        }
        let numel = t.shape.iter().try_fold(1u64, |a, &s| a.checked_mul(s));
        let numel = numel.ok_or_else(|| anyhow!("{p}: tensor `{name}` shape {:?} overflows", t.shape))?;
        if numel > 0 {
            let last = t
                .shape
                .iter()
                .zip(&t.stride)
                .try_fold(t.offset, |a, (&s, &st)| (s - 1).checked_mul(st).and_then(|x| a.checked_add(x)));
            if last.is_none_or(|l| l >= t.storage.numel) {
                bail!(
                    "{p}: tensor `{name}` (offset {}, shape {:?}, stride {:?}) reaches past its storage of {} elements",
                    t.offset,
                    t.shape,
                    t.stride,
                    t.storage.numel
                );
            }
        }
        let storage = read_entry(
            &mut self.archive.borrow_mut(),
            &format!("{}data/{key}", self.prefix),
            self.file_len,
            &self.path,
        )?;
        let shape: Vec<usize> = t.shape.iter().map(|&s| s as usize).collect();
        let el = el as usize;
        let mut bytes = Vec::with_capacity(numel as usize * el);
        // Row-major walk of the view; a contiguous view is one copy.
        let contiguous = {
            let mut expect = 1u64;
            let mut ok = true;
            for (&s, &st) in t.shape.iter().zip(&t.stride).rev() {
                if s > 1 && st != expect {
                    ok = false;
                }
                expect = expect.saturating_mul(s);
            }
            ok
        };
        if numel == 0 {
        } else if contiguous {
            let start = t.offset as usize * el;
            bytes.extend_from_slice(&storage[start..start + numel as usize * el]);
        } else {
            let mut idx = vec![0u64; shape.len()];
            for _ in 0..numel {
                let off: u64 = t.offset + idx.iter().zip(&t.stride).map(|(i, s)| i * s).sum::<u64>();
                let o = off as usize * el;
                bytes.extend_from_slice(&storage[o..o + el]);
                for d in (0..idx.len()).rev() {
                    idx[d] += 1;
                    if idx[d] < t.shape[d] {
                        break;
                    }
                    idx[d] = 0;
                }
            }
        }
        Ok(TensorData { dtype: t.storage.dtype, shape, bytes })
    }
}

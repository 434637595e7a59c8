//! Reading and validating a `.bin`/`.idx` pair (SPEC §1.2, §1.9). Everything the header
//! implies is checked before any token is served, so a truncated, forged or mismatched file
//! is an error naming the file instead of a wrong sample or a panic later.

use super::{bin_path, idx_path, TokenDType, HEADER_BYTES, MAGIC, REGENERATE_HINT, VERSION};
use anyhow::{anyhow, bail, Context};
use megatron_core::Result;
use memmap2::Mmap;
use std::fs::File;
use std::path::{Path, PathBuf};

/// A validated, memory-mapped Megatron indexed dataset.
pub struct IndexedDataset {
    prefix: PathBuf,
    dtype: TokenDType,
    /// Tokens per sequence (S).
    lengths: Vec<i32>,
    /// Byte offset of each sequence in `.bin` (S).
    pointers: Vec<i64>,
    /// Sequence-index boundaries of documents (D1 = documents + 1).
    doc_indices: Vec<i64>,
    /// `None` when the `.bin` file is empty (an empty file cannot be mapped).
    bin: Option<Mmap>,
}

/// Little-endian cursor over the `.idx` bytes; callers checked the total size first.
struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl Cursor<'_> {
    fn take<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        out.copy_from_slice(&self.bytes[self.pos..self.pos + N]);
        self.pos += N;
        out
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take())
    }
    fn i64(&mut self) -> i64 {
        i64::from_le_bytes(self.take())
    }
    fn i32(&mut self) -> i32 {
        i32::from_le_bytes(self.take())
    }
}

fn map(path: &Path, file: &File) -> Result<Mmap> {
    // SAFETY: the mapping is read-only; like numpy's memmap in Megatron, we rely on nobody
    // truncating the file while it is open (sizes were validated against the header).
    unsafe { Mmap::map(file) }.with_context(|| format!("cannot memory-map `{}`", path.display()))
}

impl IndexedDataset {
    /// Opens `prefix.idx` and `prefix.bin` and validates them against each other.
    pub fn open(prefix: impl AsRef<Path>) -> Result<IndexedDataset> {
        let prefix = prefix.as_ref().to_path_buf();
        let idx = idx_path(&prefix);
        let bin = bin_path(&prefix);
        let fail = |what: String| anyhow!("`{}`: {what}; {REGENERATE_HINT}", idx.display());

        let idx_file = File::open(&idx).with_context(|| {
            format!("cannot open the dataset index `{}`: check --data-path (a prefix without .bin/.idx)", idx.display())
        })?;
        let idx_size = idx_file.metadata().with_context(|| format!("cannot stat `{}`", idx.display()))?.len();
        if idx_size < HEADER_BYTES {
            bail!(fail(format!(
                "not a Megatron .idx file or truncated: {idx_size} bytes, shorter than the {HEADER_BYTES}-byte header"
            )));
        }
        let idx_map = map(&idx, &idx_file)?;
        let mut cur = Cursor { bytes: &idx_map, pos: 0 };
        let magic: [u8; 9] = cur.take();
        if &magic != MAGIC {
            bail!(fail(format!("not a Megatron .idx file (magic {magic:02x?}, expected \"MMIDIDX\\0\\0\")")));
        }
        let version = cur.u64();
        if version != VERSION {
            bail!(fail(format!("unsupported .idx version {version} (only version {VERSION} exists)")));
        }
        let [code] = cur.take::<1>();
        let dtype = TokenDType::from_code(code)
            .ok_or_else(|| fail(format!("unknown dtype code {code} (valid codes 1..=8)")))?;
        let (s, d1) = (cur.u64(), cur.u64());
        let expected = u128::from(HEADER_BYTES) + 12 * u128::from(s) + 8 * u128::from(d1);
        if u128::from(idx_size) != expected {
            let modes = if u128::from(idx_size) == expected + u128::from(s) {
                " (the extra bytes look like multimodal sequence modes, which are not supported)"
            } else {
                ""
            };
            bail!(fail(format!(
                "truncated or corrupt: the header (S = {s} sequences, D1 = {d1} document indices) implies \
                 {expected} bytes but the file has {idx_size}{modes}"
            )));
        }
        // The size check bounds S and D1 by the file size, so these fit in usize.
        let (s, d1) = (s as usize, d1 as usize);

        let mut lengths = Vec::with_capacity(s);
        for i in 0..s {
            let len = cur.i32();
            if len < 0 {
                bail!(fail(format!("sequence {i} has negative length {len}")));
            }
            lengths.push(len);
        }
        let itemsize = dtype.itemsize() as i128;
        let mut pointers = Vec::with_capacity(s);
        // i128: forged lengths must not overflow the running sum.
        let mut expected_ptr: i128 = 0;
        for (i, &len) in lengths.iter().enumerate() {
            let ptr = cur.i64();
            if i128::from(ptr) != expected_ptr {
                bail!(fail(format!(
                    "sequence {i} points at byte {ptr} but the lengths before it imply byte {expected_ptr}"
                )));
            }
            pointers.push(ptr);
            expected_ptr += i128::from(len) * itemsize;
        }
        let doc_indices: Vec<i64> = (0..d1).map(|_| cur.i64()).collect();
        match (doc_indices.first(), doc_indices.last()) {
            (Some(0), Some(&last)) if last == s as i64 => {}
            (first, last) => bail!(fail(format!(
                "document indices must start at 0 and end at S = {s}, found first {first:?}, last {last:?}"
            ))),
        }
        if let Some(d) = doc_indices.windows(2).position(|w| w[1] < w[0]) {
            bail!(fail(format!(
                "document indices decrease at document {d} ({} then {})",
                doc_indices[d],
                doc_indices[d + 1]
            )));
        }

        let bin_file = File::open(&bin).with_context(|| {
            format!("cannot open the dataset tokens `{}` (its .idx exists): {REGENERATE_HINT}", bin.display())
        })?;
        let bin_size = bin_file.metadata().with_context(|| format!("cannot stat `{}`", bin.display()))?.len();
        if i128::from(bin_size) != expected_ptr {
            bail!(
                "`{}` has {bin_size} bytes but its index `{}` describes {expected_ptr} bytes \
                 ({s} sequences of {dtype}); the pair is truncated or mismatched: {REGENERATE_HINT}",
                bin.display(),
                idx.display()
            );
        }
        let bin_map = if bin_size == 0 { None } else { Some(map(&bin, &bin_file)?) };
        Ok(IndexedDataset { prefix, dtype, lengths, pointers, doc_indices, bin: bin_map })
    }

    pub fn prefix(&self) -> &Path {
        &self.prefix
    }

    /// Number of sequences `S`.
    pub fn len(&self) -> usize {
        self.lengths.len()
    }

    pub fn is_empty(&self) -> bool {
        self.lengths.is_empty()
    }

    /// Number of documents (`D1 - 1`).
    pub fn num_documents(&self) -> usize {
        self.doc_indices.len() - 1
    }

    pub fn dtype(&self) -> TokenDType {
        self.dtype
    }

    pub fn sequence_lengths(&self) -> &[i32] {
        &self.lengths
    }

    pub fn sequence_pointers(&self) -> &[i64] {
        &self.pointers
    }

    pub fn document_indices(&self) -> &[i64] {
        &self.doc_indices
    }

    /// Total number of tokens in `.bin`.
    pub fn num_tokens(&self) -> u64 {
        self.lengths.iter().map(|&l| l as u64).sum()
    }

    /// The whole `.bin` content.
    pub fn bin_bytes(&self) -> &[u8] {
        self.bin.as_deref().unwrap_or(&[])
    }

    /// `length` tokens of sequence `index` from token `offset` (`None`: to the end), like
    /// Megatron's `IndexedDataset.get`. Out-of-range requests are errors.
    pub fn get(&self, index: usize, offset: usize, length: Option<usize>) -> Result<Vec<i64>> {
        let seq_len = *self.lengths.get(index).ok_or_else(|| {
            anyhow!("sequence {index} is out of range: `{}` has {} sequences", self.prefix.display(), self.len())
        })? as usize;
        let length = length.unwrap_or(seq_len.saturating_sub(offset));
        if offset.checked_add(length).is_none_or(|end| end > seq_len) {
            bail!(
                "tokens [{offset}, {offset}+{length}) of sequence {index} are out of range: it has {seq_len} tokens \
                 (dataset `{}`)",
                self.prefix.display()
            );
        }
        let item = self.dtype.itemsize();
        let start = self.pointers[index] as usize + offset * item;
        let bytes = &self.bin_bytes()[start..start + length * item];
        let mut out = Vec::with_capacity(length);
        self.dtype
            .decode_into(bytes, &mut out)
            .with_context(|| format!("sequence {index} of `{}`", bin_path(&self.prefix).display()))?;
        Ok(out)
    }

    /// All tokens of sequence `index`.
    pub fn sequence(&self, index: usize) -> Result<Vec<i64>> {
        self.get(index, 0, None)
    }
}

impl std::fmt::Debug for IndexedDataset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IndexedDataset")
            .field("prefix", &self.prefix)
            .field("dtype", &self.dtype)
            .field("sequences", &self.len())
            .field("documents", &self.num_documents())
            .finish()
    }
}

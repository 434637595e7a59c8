//! Writing a `.bin`/`.idx` pair byte-identical to Megatron's `IndexedDatasetBuilder`
//! (SPEC §1.8). Both files are written as `<path>.tmp`, fsynced and renamed on
//! [`IndexedDatasetBuilder::finalize`], so a crash never leaves a half-written dataset under
//! the real name.

use super::{bin_path, idx_path, with_suffix, IndexedDataset, TokenDType, MAGIC, VERSION};
use anyhow::{anyhow, bail, Context};
use megatron_core::Result;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// Incremental writer of one dataset prefix.
pub struct IndexedDatasetBuilder {
    prefix: PathBuf,
    dtype: TokenDType,
    bin_tmp: PathBuf,
    bin: Option<BufWriter<File>>,
    lengths: Vec<i32>,
    doc_indices: Vec<i64>,
    scratch: Vec<u8>,
}

impl IndexedDatasetBuilder {
    /// Starts `prefix.bin`/`prefix.idx` (written as `.tmp` files until `finalize`).
    pub fn create(prefix: impl AsRef<Path>, dtype: TokenDType) -> Result<Self> {
        let prefix = prefix.as_ref().to_path_buf();
        let bin_tmp = with_suffix(&prefix, ".bin.tmp");
        let file = File::create(&bin_tmp).with_context(|| format!("cannot create `{}`", bin_tmp.display()))?;
        Ok(IndexedDatasetBuilder {
            prefix,
            dtype,
            bin_tmp,
            bin: Some(BufWriter::with_capacity(1 << 20, file)),
            lengths: vec![],
            doc_indices: vec![0],
            scratch: vec![],
        })
    }

    pub fn dtype(&self) -> TokenDType {
        self.dtype
    }

    fn write_tokens<T: Copy + Into<i64>>(&mut self, tokens: &[T]) -> Result<()> {
        self.scratch.clear();
        for &t in tokens {
            self.dtype.encode_into(t.into(), &mut self.scratch)?;
        }
        let bin = self.bin.as_mut().ok_or_else(|| anyhow!("the dataset builder was already finalized"))?;
        bin.write_all(&self.scratch).with_context(|| format!("cannot write `{}`", self.bin_tmp.display()))
    }

    fn push_length(&mut self, len: usize) -> Result<()> {
        let len =
            i32::try_from(len).map_err(|_| anyhow!("a sequence of {len} tokens exceeds the .idx limit of 2^31-1"))?;
        self.lengths.push(len);
        Ok(())
    }

    /// Appends one sequence.
    pub fn add_item<T: Copy + Into<i64>>(&mut self, tokens: &[T]) -> Result<()> {
        self.write_tokens(tokens)?;
        self.push_length(tokens.len())
    }

    /// Closes the current document (its sequences are those added since the last boundary).
    pub fn end_document(&mut self) {
        self.doc_indices.push(self.lengths.len() as i64);
    }

    /// Appends a whole document: `tokens` is the concatenation of sequences of `lengths`.
    pub fn add_document<T: Copy + Into<i64>>(&mut self, tokens: &[T], lengths: &[usize]) -> Result<()> {
        let total: usize = lengths.iter().sum();
        if total != tokens.len() {
            bail!("add_document: the sequence lengths sum to {total} but {} tokens were given", tokens.len());
        }
        self.write_tokens(tokens)?;
        for &len in lengths {
            self.push_length(len)?;
        }
        self.end_document();
        Ok(())
    }

    /// Appends every document of the dataset at `other` (same dtype), copying its `.bin` bytes.
    pub fn add_index(&mut self, other: impl AsRef<Path>) -> Result<()> {
        let other = IndexedDataset::open(other)?;
        if other.dtype() != self.dtype {
            bail!(
                "cannot merge `{}`: its dtype is {} but this dataset's is {}",
                other.prefix().display(),
                other.dtype(),
                self.dtype
            );
        }
        let offset = self.lengths.len() as i64;
        self.lengths.extend_from_slice(other.sequence_lengths());
        self.doc_indices.extend(other.document_indices()[1..].iter().map(|&d| d + offset));
        let bin = self.bin.as_mut().ok_or_else(|| anyhow!("the dataset builder was already finalized"))?;
        bin.write_all(other.bin_bytes()).with_context(|| format!("cannot write `{}`", self.bin_tmp.display()))
    }

    /// Streams the `.idx` of everything added so far (SPEC §1.2) into `out`, so finalizing a
    /// large dataset needs no second copy of its index in memory.
    fn write_index(&self, out: &mut impl Write) -> std::io::Result<()> {
        out.write_all(MAGIC)?;
        out.write_all(&VERSION.to_le_bytes())?;
        out.write_all(&[self.dtype.code()])?;
        out.write_all(&(self.lengths.len() as u64).to_le_bytes())?;
        out.write_all(&(self.doc_indices.len() as u64).to_le_bytes())?;
        for &len in &self.lengths {
            out.write_all(&len.to_le_bytes())?;
        }
        let mut ptr: i64 = 0;
        for &len in &self.lengths {
            out.write_all(&ptr.to_le_bytes())?;
            ptr += i64::from(len) * self.dtype.itemsize() as i64;
        }
        for &d in &self.doc_indices {
            out.write_all(&d.to_le_bytes())?;
        }
        Ok(())
    }

    /// Writes `.idx`, fsyncs both files and renames them into place.
    pub fn finalize(mut self) -> Result<()> {
        let bin = self.bin.take().ok_or_else(|| anyhow!("the dataset builder was already finalized"))?;
        let file = bin.into_inner().map_err(|e| anyhow!("cannot write `{}`: {}", self.bin_tmp.display(), e.error()))?;
        file.sync_all().with_context(|| format!("cannot fsync `{}`", self.bin_tmp.display()))?;
        drop(file);

        let idx_tmp = with_suffix(&self.prefix, ".idx.tmp");
        let write_idx = || -> std::io::Result<()> {
            let mut f = BufWriter::with_capacity(1 << 20, File::create(&idx_tmp)?);
            self.write_index(&mut f)?;
            f.into_inner().map_err(|e| e.into_error())?.sync_all()
        };
        if let Err(e) = write_idx() {
            // Leave no temporary file behind (`Drop` no longer sees the `.bin`).
            let _ = std::fs::remove_file(&idx_tmp);
            let _ = std::fs::remove_file(&self.bin_tmp);
            return Err(e).with_context(|| format!("cannot write `{}`", idx_tmp.display()));
        }

        let (bin_final, idx_final) = (bin_path(&self.prefix), idx_path(&self.prefix));
        std::fs::rename(&self.bin_tmp, &bin_final)
            .with_context(|| format!("cannot rename `{}` to `{}`", self.bin_tmp.display(), bin_final.display()))?;
        std::fs::rename(&idx_tmp, &idx_final)
            .with_context(|| format!("cannot rename `{}` to `{}`", idx_tmp.display(), idx_final.display()))?;
        // Persist the renames themselves.
        let dir = match self.prefix.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        File::open(&dir)
            .and_then(|d| d.sync_all())
            .with_context(|| format!("cannot fsync the directory `{}`", dir.display()))?;
        Ok(())
    }
}

impl Drop for IndexedDatasetBuilder {
    fn drop(&mut self) {
        // An unfinished builder leaves no temporary file behind; failure to remove it is
        // harmless (the `.tmp` name is never read).
        if self.bin.is_some() {
            let _ = std::fs::remove_file(&self.bin_tmp);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SPEC §1.7, written out byte by byte.
    const WORKED_IDX: [u8; 82] = [
        0x4d, 0x4d, 0x49, 0x44, 0x49, 0x44, 0x58, 0x00, 0x00, // magic
        0x01, 0, 0, 0, 0, 0, 0, 0,    // version 1
        0x08, // uint16
        0x02, 0, 0, 0, 0, 0, 0, 0, // S = 2
        0x03, 0, 0, 0, 0, 0, 0, 0, // D1 = 3
        0x03, 0, 0, 0, 0x02, 0, 0, 0, // lengths [3, 2]
        0, 0, 0, 0, 0, 0, 0, 0, 0x06, 0, 0, 0, 0, 0, 0, 0, // pointers [0, 6]
        0, 0, 0, 0, 0, 0, 0, 0, 0x01, 0, 0, 0, 0, 0, 0, 0, 0x02, 0, 0, 0, 0, 0, 0, 0, // docs [0, 1, 2]
    ];
    const WORKED_BIN: [u8; 10] = [0x01, 0, 0x02, 0, 0x03, 0, 0x04, 0, 0x05, 0];

    #[test]
    fn reproduces_the_spec_worked_example_byte_for_byte() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let prefix = dir.path().join("worked");
        let mut b = IndexedDatasetBuilder::create(&prefix, TokenDType::U16)?;
        b.add_item(&[1u32, 2, 3])?;
        b.end_document();
        b.add_item(&[4u32, 5])?;
        b.end_document();
        b.finalize()?;
        assert_eq!(std::fs::read(idx_path(&prefix))?, WORKED_IDX);
        assert_eq!(std::fs::read(bin_path(&prefix))?, WORKED_BIN);
        assert!(!with_suffix(&prefix, ".bin.tmp").exists() && !with_suffix(&prefix, ".idx.tmp").exists());

        let ds = IndexedDataset::open(&prefix)?;
        assert_eq!((ds.len(), ds.num_documents(), ds.dtype()), (2, 2, TokenDType::U16));
        assert_eq!(ds.sequence_pointers(), [0, 6]);
        assert_eq!(ds.get(0, 1, Some(2))?, [2, 3]);
        assert_eq!(ds.sequence(1)?, [4, 5]);
        assert!(ds.get(2, 0, None).is_err());
        assert!(ds.get(1, 1, Some(2)).is_err());
        assert!(ds.get(1, 3, None).is_err());
        Ok(())
    }

    #[test]
    fn add_document_and_add_index_merge_like_megatron() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let (a, b, merged) = (dir.path().join("a"), dir.path().join("b"), dir.path().join("m"));
        let mut w = IndexedDatasetBuilder::create(&a, TokenDType::I32)?;
        w.add_document(&[1i64, 2, 3, 4], &[1, 3])?;
        w.finalize()?;
        let mut w = IndexedDatasetBuilder::create(&b, TokenDType::I32)?;
        w.add_document(&[7i64, 8], &[2])?;
        w.end_document(); // an empty document
        w.finalize()?;
        let mut w = IndexedDatasetBuilder::create(&merged, TokenDType::I32)?;
        w.add_index(&a)?;
        w.add_index(&b)?;
        w.finalize()?;
        let m = IndexedDataset::open(&merged)?;
        assert_eq!(m.sequence_lengths(), [1, 3, 2]);
        assert_eq!(m.document_indices(), [0, 2, 3, 3]);
        assert_eq!(m.sequence(2)?, [7, 8]);
        assert!(w_mismatch(&dir, &a).is_err());
        assert!(IndexedDatasetBuilder::create(dir.path().join("x"), TokenDType::U8)?.add_item(&[300u32]).is_err());
        Ok(())
    }

    fn w_mismatch(dir: &tempfile::TempDir, other: &Path) -> Result<()> {
        let mut w = IndexedDatasetBuilder::create(dir.path().join("u16"), TokenDType::U16)?;
        w.add_index(other)
    }

    #[test]
    fn dropped_builder_leaves_no_files() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let prefix = dir.path().join("unfinished");
        let mut w = IndexedDatasetBuilder::create(&prefix, TokenDType::U16)?;
        w.add_item(&[1u32])?;
        drop(w);
        assert_eq!(std::fs::read_dir(dir.path())?.count(), 0);
        Ok(())
    }
}

//! Megatron's indexed dataset: the `.bin` token file and its `.idx` index (SPEC §1).
//! [`IndexedDataset`] validates and memory-maps an existing pair; [`IndexedDatasetBuilder`]
//! writes a byte-identical pair atomically.

mod dtype;
mod reader;
mod writer;

pub use dtype::TokenDType;
pub use reader::IndexedDataset;
pub use writer::IndexedDatasetBuilder;

use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// `.idx` magic: `"MMIDIDX\0\0"`.
pub const MAGIC: &[u8; 9] = b"MMIDIDX\x00\x00";
/// The only `.idx` version.
pub const VERSION: u64 = 1;
/// Bytes before `sequence_lengths`: magic, version, dtype code, `S`, `D1`.
pub const HEADER_BYTES: u64 = 9 + 8 + 1 + 8 + 8;

/// `prefix + suffix`, appended literally (the prefix may contain dots).
pub fn with_suffix(prefix: &Path, suffix: &str) -> PathBuf {
    let mut s: OsString = prefix.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

/// `P.idx`.
pub fn idx_path(prefix: &Path) -> PathBuf {
    with_suffix(prefix, ".idx")
}

/// `P.bin`.
pub fn bin_path(prefix: &Path) -> PathBuf {
    with_suffix(prefix, ".bin")
}

/// What to tell the user when a dataset file is damaged.
pub(crate) const REGENERATE_HINT: &str =
    "re-run `megatron preprocess` (or Megatron's tools/preprocess_data.py) to regenerate the dataset";

//! Helpers shared by this crate's integration tests: locating `shared/data` (tests skip when
//! it is absent) and reading JSON-lines fixtures.

#![allow(dead_code)] // each test binary uses a different subset

use serde::Deserialize;
use std::path::{Path, PathBuf};

/// `shared/data` above this crate, if it holds `probe`; prints a SKIP line otherwise.
pub fn data_dir(probe: &str) -> Option<PathBuf> {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let dir = manifest.ancestors().map(|a| a.join("shared/data")).find(|d| d.join(probe).is_file());
    if dir.is_none() {
        eprintln!("SKIP: shared/data/{probe} not found above {}", manifest.display());
    }
    dir
}

#[derive(Deserialize)]
pub struct Doc {
    pub text: String,
}

#[derive(Deserialize)]
pub struct Golden {
    pub doc: usize,
    pub ids: Vec<u32>,
}

pub fn read_jsonl<T: for<'de> Deserialize<'de>>(path: &Path) -> anyhow::Result<Vec<T>> {
    let text = std::fs::read_to_string(path)?;
    text.lines().filter(|l| !l.trim().is_empty()).map(|l| Ok(serde_json::from_str(l)?)).collect()
}

/// A small seeded generator (PCG-style LCG) so property tests need no extra crate.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        self.0 >> 33
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

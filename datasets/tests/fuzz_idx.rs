//! A seeded mutation fuzzer for the `.idx`/`.bin` reader (no cargo-fuzz, no nightly): valid
//! datasets (every dtype, empty documents, the real tinyshakespeare index when `../shared/data`
//! exists) are mutated (bit flips, interesting integers written into header fields and
//! arrays, header counts rewritten so the size check passes and the deeper checks run,
//! truncation, extension, splices, a resized `.bin`), written to disk and opened; every opened
//! dataset serves random (also out-of-range) `get`s. Every outcome must be `Ok` or an error:
//! a panic fails, and so does a single allocation above the bound (a forged count must never
//! size a buffer).
//!
//! `fuzz_idx_quick` (in the suite) runs a few thousand inputs; `fuzz_idx_session` (ignored)
//! runs for `FUZZ_IDX_SECONDS` (default 600) — `scripts/fuzz_idx.sh` runs it in release mode.

use megatron_datasets::{IndexedDataset, IndexedDatasetBuilder, TokenDType};
use std::alloc::{GlobalAlloc, Layout, System};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Counts the largest single allocation of this test binary.
struct Counting;

static MAX_ALLOC: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator; only records sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        MAX_ALLOC.fetch_max(layout.size(), Ordering::Relaxed);
        System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        MAX_ALLOC.fetch_max(layout.size(), Ordering::Relaxed);
        System.alloc_zeroed(layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        MAX_ALLOC.fetch_max(new_size, Ordering::Relaxed);
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// splitmix64: seeded and dependency-free.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }
}

const HEADER: usize = 9 + 8 + 1 + 8 + 8;

/// Integers that break arithmetic: zero, signs, powers of two, type limits.
fn interesting(rng: &mut Rng) -> u64 {
    const V: [u64; 14] = [
        0,
        1,
        2,
        7,
        0x7f,
        0x80,
        0xff,
        0x7fff_ffff,
        0x8000_0000,
        0xffff_ffff,
        0x7fff_ffff_ffff_ffff,
        0x8000_0000_0000_0000,
        u64::MAX,
        u64::MAX - 1,
    ];
    match rng.below(3) {
        0 => V[rng.below(V.len())],
        1 => rng.next() >> rng.below(64),
        _ => (rng.below(1 << 20) as u64).wrapping_neg(),
    }
}

/// A valid dataset: `(idx bytes, bin bytes)`.
fn seed_dataset(dir: &Path, rng: &mut Rng, n: usize) -> (Vec<u8>, Vec<u8>) {
    let dtypes = [TokenDType::U8, TokenDType::I16, TokenDType::I32, TokenDType::I64, TokenDType::U16];
    let dtype = dtypes[n % dtypes.len()];
    let prefix = dir.join(format!("seed{n}"));
    let mut b = IndexedDatasetBuilder::create(&prefix, dtype).expect("builder");
    for _ in 0..rng.below(6) {
        for _ in 0..rng.below(4) {
            let toks: Vec<i32> = (0..rng.below(20)).map(|_| rng.below(100) as i32).collect();
            b.add_item(&toks).expect("add_item");
        }
        b.end_document();
    }
    b.finalize().expect("finalize");
    let idx = std::fs::read(prefix.with_extension("idx")).expect("seed idx");
    let bin = std::fs::read(prefix.with_extension("bin")).expect("seed bin");
    (idx, bin)
}

fn put(bytes: &mut [u8], at: usize, value: u64, width: usize) {
    if at + width <= bytes.len() {
        bytes[at..at + width].copy_from_slice(&value.to_le_bytes()[..width]);
    }
}

/// One to four mutations of `idx` (and sometimes `bin`).
fn mutate(rng: &mut Rng, idx: &mut Vec<u8>, bin: &mut Vec<u8>) {
    for _ in 0..1 + rng.below(4) {
        let len = idx.len().max(1);
        match rng.below(12) {
            0 => {
                let at = rng.below(len);
                if at < idx.len() {
                    idx[at] ^= 1 << rng.below(8);
                }
            }
            1 => {
                let at = rng.below(len);
                if at < idx.len() {
                    idx[at] = rng.next() as u8;
                }
            }
            // Header fields: version, dtype code, S, D1.
            2 => {
                let field = rng.below(4);
                let value = interesting(rng);
                put(idx, [9, 17, 18, 26][field], value, [8, 1, 8, 8][field]);
            }
            // S and D1 rewritten so that the file size still matches the header.
            3 if idx.len() >= HEADER => {
                let body = (idx.len() - HEADER) as u64;
                let s = rng.below(body as usize / 12 + 1) as u64;
                let rest = body - 12 * s;
                put(idx, 18, s, 8);
                put(idx, 26, rest / 8, 8);
                // Drop the bytes that do not fill a whole document index.
                idx.truncate(idx.len() - (rest % 8) as usize);
            }
            // An interesting i32/i64 into the arrays.
            4 => {
                let at = HEADER + rng.below(len.saturating_sub(HEADER).max(1));
                let value = interesting(rng);
                let width = if rng.below(2) == 0 { 4 } else { 8 };
                put(idx, at, value, width);
            }
            5 => idx.truncate(rng.below(len)),
            6 => idx.extend((0..1 + rng.below(24)).map(|_| rng.next() as u8)),
            // Splice: copy a run of the file over another place.
            7 => {
                let (from, to, n) = (rng.below(len), rng.below(len), rng.below(32));
                let run: Vec<u8> = idx.iter().skip(from).take(n).cloned().collect();
                for (i, b) in run.into_iter().enumerate() {
                    if to + i < idx.len() {
                        idx[to + i] = b;
                    }
                }
            }
            8 => {
                let n = bin.len();
                bin.truncate(rng.below(n + 1));
            }
            9 => bin.extend((0..1 + rng.below(16)).map(|_| rng.next() as u8)),
            // New lengths with consistent pointers and `.bin` size: reaches the document checks
            // and the readers with odd but valid-looking shapes (zero-length sequences).
            10 => fix_up(rng, idx, bin),
            // Magic bytes, half as often as the others.
            11 if rng.below(2) == 0 => {
                let (at, value) = (rng.below(9), rng.next());
                put(idx, at, value, 1);
            }
            _ => fix_up(rng, idx, bin),
        }
    }
}

/// Rewrites the lengths (small, some zero), the pointers they imply and the `.bin` size.
fn fix_up(rng: &mut Rng, idx: &mut [u8], bin: &mut Vec<u8>) {
    if idx.len() < HEADER {
        return;
    }
    let s = u64::from_le_bytes(idx[18..26].try_into().expect("8 bytes"));
    let itemsize = match idx[17] {
        1 | 2 => 1,
        3 | 8 => 2,
        4 | 7 => 4,
        _ => 8,
    };
    if (s as u128) * 12 > (idx.len() - HEADER) as u128 {
        return;
    }
    let s = s as usize;
    let mut ptr = 0u64;
    for i in 0..s {
        let len = if rng.below(4) == 0 { 0 } else { rng.below(9) as u64 };
        put(idx, HEADER + 4 * i, len, 4);
        put(idx, HEADER + 4 * s + 8 * i, ptr, 8);
        ptr += len * itemsize;
    }
    bin.resize(ptr as usize, 7);
}

#[derive(Default, Debug)]
struct Stats {
    inputs: u64,
    opened: u64,
    rejected: u64,
    panics: u64,
    gets: u64,
    first_panic: Option<String>,
}

/// Opens the dataset at `prefix` and reads from it; `Err(message)` on a panic.
fn exercise(prefix: &Path, rng: &mut Rng, stats: &mut Stats) -> Result<(), String> {
    let seed = rng.next();
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        let mut r = Rng(seed);
        let mut gets = 0u64;
        let ds = match IndexedDataset::open(prefix) {
            Ok(ds) => ds,
            Err(e) => {
                // Errors name the file they are about.
                let msg = format!("{e:#}");
                assert!(msg.contains("seed") || msg.contains("fuzz"), "error does not name the file: {msg}");
                return (false, 0);
            }
        };
        let _ = (ds.num_tokens(), ds.num_documents(), ds.document_indices().len(), ds.bin_bytes().len());
        // Integer tokens always decode; float dtypes may hold non-integers (a clear error).
        let float = matches!(ds.dtype(), TokenDType::F32 | TokenDType::F64);
        for i in 0..ds.len().min(64) {
            match ds.sequence(i) {
                Ok(_) => {}
                Err(e) if float => assert!(format!("{e:#}").contains("not a token id"), "{e:#}"),
                Err(e) => panic!("a validated sequence does not read back: {e:#}"),
            }
            gets += 1;
        }
        for _ in 0..16 {
            let index = r.below(ds.len() + 2);
            let offset = r.below(40);
            let length = if r.below(3) == 0 {
                None
            } else {
                let bits = r.below(40);
                Some(r.below(1 << bits))
            };
            let _ = ds.get(index, offset, length);
            gets += 1;
        }
        (true, gets)
    }));
    match outcome {
        Ok((opened, gets)) => {
            if opened {
                stats.opened += 1;
            } else {
                stats.rejected += 1;
            }
            stats.gets += gets;
            Ok(())
        }
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            Err(msg)
        }
    }
}

/// Runs the fuzzer until `max_inputs` or `budget`; returns the statistics.
fn fuzz(seed: u64, max_inputs: u64, budget: Duration, keep_failures: Option<&Path>) -> Stats {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut rng = Rng(seed);
    let mut seeds: Vec<(Vec<u8>, Vec<u8>)> = (0..10).map(|n| seed_dataset(dir.path(), &mut rng, n)).collect();
    let shared = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/data/tinyshakespeare_gpt2_text_document");
    match (std::fs::read(shared.with_extension("idx")), std::fs::read(shared.with_extension("bin"))) {
        (Ok(idx), Ok(bin)) => seeds.push((idx, bin)),
        _ => eprintln!("note: {} absent, fuzzing the generated seeds only", shared.display()),
    }
    let prefix = dir.path().join("fuzz");
    let mut stats = Stats::default();
    let start = Instant::now();
    while stats.inputs < max_inputs && start.elapsed() < budget {
        let (mut idx, mut bin) = seeds[rng.below(seeds.len())].clone();
        mutate(&mut rng, &mut idx, &mut bin);
        std::fs::write(prefix.with_extension("idx"), &idx).expect("write idx");
        std::fs::write(prefix.with_extension("bin"), &bin).expect("write bin");
        stats.inputs += 1;
        if let Err(msg) = exercise(&prefix, &mut rng, &mut stats) {
            stats.panics += 1;
            stats.first_panic.get_or_insert(msg);
            if let Some(keep) = keep_failures {
                let _ = std::fs::create_dir_all(keep);
                let _ = std::fs::write(keep.join(format!("panic{}.idx", stats.panics)), &idx);
                let _ = std::fs::write(keep.join(format!("panic{}.bin", stats.panics)), &bin);
            }
        }
    }
    stats
}

/// No single allocation may exceed this (the largest seed is the 144 KiB tinyshakespeare index).
const MAX_ONE_ALLOCATION: usize = 64 << 20;

#[test]
fn fuzz_idx_quick() {
    let stats = fuzz(0x1d5, 3000, Duration::from_secs(120), None);
    eprintln!("fuzz_idx_quick: {stats:?}, largest allocation {} bytes", MAX_ALLOC.load(Ordering::Relaxed));
    assert_eq!(stats.panics, 0, "the reader panicked: {:?}", stats.first_panic);
    assert!(stats.opened > 0 && stats.rejected > 0, "the mutations must reach both outcomes: {stats:?}");
    assert!(MAX_ALLOC.load(Ordering::Relaxed) <= MAX_ONE_ALLOCATION, "an allocation exceeded the bound");
}

#[test]
#[ignore = "a long fuzzing session: scripts/fuzz_idx.sh"]
fn fuzz_idx_session() {
    let secs = std::env::var("FUZZ_IDX_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(600);
    let seed = std::env::var("FUZZ_IDX_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x5eed);
    let keep = std::env::var_os("FUZZ_IDX_FAILURES").map(PathBuf::from);
    let stats = fuzz(seed, u64::MAX, Duration::from_secs(secs), keep.as_deref());
    println!(
        "fuzz_idx_session: seed {seed} for {secs} s: {} inputs, {} opened, {} rejected with an error, {} panics, \
         {} reads; largest single allocation {} bytes",
        stats.inputs,
        stats.opened,
        stats.rejected,
        stats.panics,
        stats.gets,
        MAX_ALLOC.load(Ordering::Relaxed)
    );
    assert_eq!(stats.panics, 0, "the reader panicked: {:?}", stats.first_panic);
    assert!(MAX_ALLOC.load(Ordering::Relaxed) <= MAX_ONE_ALLOCATION, "an allocation exceeded the bound");
}

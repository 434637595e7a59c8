//! Seeded mutation fuzzing of the checkpoint loader: `metadata.json` (JSON-aware mutations of
//! its fields and raw byte edits) and the safetensors shard (its header JSON, header-length
//! prefix and bytes) are mutated and fed to the real loaders: `load_model` (the path of
//! `generate`, `serve` and `export hf`) and `megatron_checkpoint::load` + `load_params` +
//! `optimizer_state` into a fixed model (the path of `pretrain --load`).
//!
//! Every case must end in `Ok` or an error: a panic fails the test, and a counting global
//! allocator refuses any single allocation above [`ALLOC_CAP`] (the process then aborts, so a
//! metadata-driven allocation fails the test instead of exhausting the machine). The largest
//! allocation seen is reported.
//!
//! Quick by default (`MEGATRON_FUZZ_CASES`, default 150 cases); `scripts/fuzz_checkpoint.sh`
//! runs a long session with `MEGATRON_FUZZ_SECONDS`. `MEGATRON_FUZZ_SEED` picks the seed.
#![cfg(all(feature = "gpt", feature = "checkpoint", feature = "tokenizers", feature = "optim"))]

mod common;
use megatron::generate::{load_model, LoadArgs};
use megatron_core::{Model, Registry};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::Value;
use std::alloc::{GlobalAlloc, Layout, System};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Largest single allocation allowed: the fuzzed checkpoint is ~100 KB, so anything near this
/// came from trusting a mutated size.
const ALLOC_CAP: usize = 512 << 20;

struct Counting;
static MAX_ALLOC: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator; only records sizes and refuses oversized requests.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        MAX_ALLOC.fetch_max(layout.size(), Ordering::Relaxed);
        if layout.size() > ALLOC_CAP {
            return std::ptr::null_mut();
        }
        System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        MAX_ALLOC.fetch_max(layout.size(), Ordering::Relaxed);
        if layout.size() > ALLOC_CAP {
            return std::ptr::null_mut();
        }
        System.alloc_zeroed(layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        MAX_ALLOC.fetch_max(new_size, Ordering::Relaxed);
        if new_size > ALLOC_CAP {
            return std::ptr::null_mut();
        }
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const INTERESTING: [i128; 16] = [
    0,
    1,
    -1,
    2,
    3,
    7,
    100_000,
    1 << 20,
    i32::MAX as i128,
    1 << 31,
    u32::MAX as i128,
    1 << 40,
    1 << 53,
    i64::MAX as i128,
    u64::MAX as i128,
    i64::MIN as i128,
];

fn random_number(rng: &mut ChaCha8Rng) -> Value {
    match rng.gen_range(0..4) {
        0 => serde_json::json!(rng.gen::<u64>()),
        1 => serde_json::json!([1e300, -0.5, 0.5, 1e-300, 3.0][rng.gen_range(0..5)]),
        _ => {
            let v = INTERESTING[rng.gen_range(0..INTERESTING.len())];
            if v < 0 {
                serde_json::json!(v as i64)
            } else {
                serde_json::json!(v as u64)
            }
        }
    }
}

fn random_string(rng: &mut ChaCha8Rng) -> Value {
    let choices = [
        "",
        "F64",
        "F16",
        "I32",
        "model_tp00_pp000.safetensors",
        "../model_tp00_pp000.safetensors",
        "missing.safetensors",
        "embedding.word_embeddings.weight",
        "optimizer.embedding.word_embeddings.weight.exp_avg",
        "megatron-rs",
        "GPT2BPETokenizer",
        "NullTokenizer",
        "RMSNorm",
    ];
    Value::String(choices[rng.gen_range(0..choices.len())].to_string())
}

/// JSON pointers of every node of `v`.
fn paths(v: &Value, at: String, out: &mut Vec<String>) {
    out.push(at.clone());
    match v {
        Value::Object(m) => {
            m.iter().for_each(|(k, c)| paths(c, format!("{at}/{}", k.replace('~', "~0").replace('/', "~1")), out))
        }
        Value::Array(a) => a.iter().enumerate().for_each(|(i, c)| paths(c, format!("{at}/{i}"), out)),
        _ => {}
    }
}

/// One structural mutation of a random node of `root`.
fn mutate_json(root: &mut Value, rng: &mut ChaCha8Rng) {
    let mut all = Vec::new();
    paths(root, String::new(), &mut all);
    let at = all.choose(rng).cloned().unwrap_or_default();
    let Some(node) = root.pointer_mut(&at) else { return };
    match (node, rng.gen_range(0..10)) {
        (Value::Array(a), 0..=3) if !a.is_empty() => {
            let i = rng.gen_range(0..a.len());
            match rng.gen_range(0..3) {
                0 => {
                    a.remove(i);
                }
                1 => {
                    let dup = a[i].clone();
                    a.push(dup);
                }
                _ => a.push(random_number(rng)),
            }
        }
        (Value::Object(m), 0..=3) if !m.is_empty() => {
            let key = m.keys().nth(rng.gen_range(0..m.len())).cloned().unwrap_or_default();
            if rng.gen_bool(0.5) {
                m.remove(&key);
            } else if let Some(v) = m.get(&key).cloned() {
                m.insert(format!("{key}x"), v);
            }
        }
        (node @ Value::Number(_), _) => *node = random_number(rng),
        (node @ Value::String(_), _) => *node = random_string(rng),
        (node, 8) => *node = Value::Null,
        (node, 9) => *node = random_number(rng),
        (node, _) => *node = if rng.gen_bool(0.5) { random_string(rng) } else { Value::Bool(rng.gen()) },
    }
}

/// A few random byte edits: flips, truncation, insertion.
fn mutate_bytes(bytes: &mut Vec<u8>, rng: &mut ChaCha8Rng, region: std::ops::Range<usize>) {
    for _ in 0..rng.gen_range(1..4) {
        let region = region.start.min(bytes.len())..region.end.min(bytes.len());
        if region.is_empty() {
            return;
        }
        let i = rng.gen_range(region.clone());
        match rng.gen_range(0..6) {
            0 => bytes.truncate(i),
            1 => bytes.insert(i, rng.gen()),
            _ => bytes[i] ^= 1 << rng.gen_range(0..8),
        }
    }
}

/// A mutated safetensors file: header JSON, header length, or raw bytes.
fn mutate_safetensors(good: &[u8], rng: &mut ChaCha8Rng) -> Vec<u8> {
    let n = u64::from_le_bytes(good[..8].try_into().expect("8 bytes")) as usize;
    let (header, data) = (&good[8..8 + n], &good[8 + n..]);
    let mut out = Vec::with_capacity(good.len() + 64);
    match rng.gen_range(0..4) {
        0 | 1 => {
            let mut h: Value = serde_json::from_slice(header).expect("our header is JSON");
            for _ in 0..rng.gen_range(1..3) {
                mutate_json(&mut h, rng);
            }
            let text = h.to_string();
            out.extend((text.len() as u64).to_le_bytes());
            out.extend(text.as_bytes());
            out.extend(data);
        }
        2 => {
            let len = match rng.gen_range(0..3) {
                0 => rng.gen::<u64>(),
                1 => (n as u64).wrapping_add(rng.gen_range(0..16)).wrapping_sub(8),
                _ => INTERESTING[rng.gen_range(0..INTERESTING.len())] as u64,
            };
            out.extend(len.to_le_bytes());
            out.extend(&good[8..]);
        }
        _ => {
            out.extend(good);
            let end = if rng.gen_bool(0.7) { 8 + n } else { good.len() };
            mutate_bytes(&mut out, rng, 0..end);
        }
    }
    out
}

struct Base {
    meta: Vec<u8>,
    shard: Vec<u8>,
    shard_name: String,
}

fn write_case(dir: &Path, meta: &[u8], shard_name: &str, shard: &[u8]) {
    let iter = dir.join("iter_0000004");
    std::fs::create_dir_all(&iter).unwrap();
    std::fs::write(dir.join("latest_checkpointed_iteration.txt"), "4").unwrap();
    std::fs::write(iter.join("metadata.json"), meta).unwrap();
    std::fs::write(iter.join(shard_name), shard).unwrap();
}

#[derive(Default, Debug)]
struct Counts {
    cases: u64,
    ok: [u64; 2],
    errors: [u64; 2],
    panics: u64,
}

#[test]
fn mutated_checkpoints_give_errors_never_panics_or_huge_allocations() {
    let seed: u64 = std::env::var("MEGATRON_FUZZ_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(1);
    let seconds: Option<u64> = std::env::var("MEGATRON_FUZZ_SECONDS").ok().and_then(|s| s.parse().ok());
    let max_cases: u64 = std::env::var("MEGATRON_FUZZ_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(150);
    let tmp = tempfile::tempdir().unwrap();
    let save = tmp.path().join("base");
    common::pretrain(&common::tiny_with(&format!(
        "--train-iters 4 --lr-warmup-iters 1 --save {} --save-interval 4 --log-interval 100",
        save.display()
    )))
    .unwrap();
    let iter = save.join("iter_0000004");
    let shard_name = "model_tp00_pp000.safetensors".to_string();
    let base = Base {
        meta: std::fs::read(iter.join("metadata.json")).unwrap(),
        shard: std::fs::read(iter.join(&shard_name)).unwrap(),
        shard_name,
    };
    let registry = Registry::builtin().unwrap();
    let flags =
        LoadArgs { load: tmp.path().join("case"), backend: "cpu".into(), threads: Some(1), ..Default::default() };
    // The model `pretrain --load` would have built from its own flags.
    let mut fixed = load_model(&registry, &LoadArgs { load: save.clone(), ..flags.clone() }).unwrap().model;
    let start_alloc = MAX_ALLOC.load(Ordering::Relaxed);
    MAX_ALLOC.store(0, Ordering::Relaxed);

    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut counts = Counts::default();
    let started = Instant::now();
    let deadline = seconds.map(|s| started + Duration::from_secs(s));
    loop {
        match deadline {
            Some(d) if Instant::now() >= d => break,
            None if counts.cases >= max_cases => break,
            _ => {}
        }
        counts.cases += 1;
        let (mut meta, mut shard) = (base.meta.clone(), base.shard.clone());
        match rng.gen_range(0..10) {
            0..=4 => {
                let mut v: Value = serde_json::from_slice(&meta).unwrap();
                for _ in 0..rng.gen_range(1..4) {
                    mutate_json(&mut v, &mut rng);
                }
                meta = v.to_string().into_bytes();
            }
            5 => {
                let len = meta.len();
                mutate_bytes(&mut meta, &mut rng, 0..len);
            }
            6..=8 => shard = mutate_safetensors(&base.shard, &mut rng),
            _ => {
                let mut v: Value = serde_json::from_slice(&meta).unwrap();
                mutate_json(&mut v, &mut rng);
                meta = v.to_string().into_bytes();
                shard = mutate_safetensors(&base.shard, &mut rng);
            }
        }
        let case_dir = &flags.load;
        let _ = std::fs::remove_dir_all(case_dir);
        write_case(case_dir, &meta, &base.shard_name, &shard);
        // Path 1: generate / serve / export hf.
        match catch_unwind(AssertUnwindSafe(|| load_model(&registry, &flags).map(|_| ()))) {
            Ok(Ok(())) => counts.ok[0] += 1,
            Ok(Err(_)) => counts.errors[0] += 1,
            Err(_) => {
                counts.panics += 1;
                eprintln!("PANIC in load_model, seed {seed}, case {}", counts.cases);
            }
        }
        // Path 2: pretrain --load into a model built from the run's own flags.
        let pretrain_path = || -> anyhow::Result<()> {
            let ckpt = megatron_checkpoint::load(case_dir, None)?;
            let b = fixed.backend();
            let mut params = fixed.params_mut();
            ckpt.load_params(&mut params, b.as_ref())?;
            let params = fixed.params();
            ckpt.optimizer_state(&params, b.as_ref())?;
            Ok(())
        };
        match catch_unwind(AssertUnwindSafe(pretrain_path)) {
            Ok(Ok(())) => counts.ok[1] += 1,
            Ok(Err(_)) => counts.errors[1] += 1,
            Err(_) => {
                counts.panics += 1;
                eprintln!("PANIC in checkpoint load, seed {seed}, case {}", counts.cases);
            }
        }
    }
    let max_alloc = MAX_ALLOC.load(Ordering::Relaxed);
    println!(
        "checkpoint fuzz: seed {seed}, {} cases in {:.1} s; load_model ok {} / error {}; pretrain-load ok {} / \
         error {}; panics {}; largest single allocation {} bytes (base load: {start_alloc} bytes)",
        counts.cases,
        started.elapsed().as_secs_f64(),
        counts.ok[0],
        counts.errors[0],
        counts.ok[1],
        counts.errors[1],
        counts.panics,
        max_alloc
    );
    assert_eq!(counts.panics, 0, "{counts:?}");
    assert!(counts.errors[0] > 0 && counts.errors[1] > 0, "the mutations never broke anything: {counts:?}");
}

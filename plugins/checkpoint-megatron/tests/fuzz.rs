//! Seeded mutation fuzzing of the reader: mutated pickles (byte flips, truncations, inserted
//! opcodes) and mutated zip archives must give `Ok` or a clean error, never a panic or an
//! unbounded allocation. `FUZZ_SECONDS=600 cargo test --release -p megatron-checkpoint-megatron
//! --test fuzz -- --nocapture` runs longer (scripts/fuzz_megatron_checkpoint.sh).

use megatron_checkpoint_megatron::optim_read::read_optimizer;
use megatron_checkpoint_megatron::pickle::unpickle;
use megatron_checkpoint_megatron::{dist, legacy, TorchFile, Value};
use std::io::Read;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::time::{Duration, Instant};

fn shard() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/megatron_legacy_tp2pp2/iter_0000010/mp_rank_00_001/model_optim_rng.pt")
}

/// xorshift64*: a dependency-free, seeded generator.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Interesting bytes: opcodes and length prefixes that stress the decoder.
const SPICE: &[u8] = &[
    0x80, 0x95, b'.', b'(', b'0', b'1', b'2', b'N', b'J', b'K', b'M', 0x8a, 0x8b, b'G', b'X', 0x8c, 0x8d, b'B', 0x8e,
    b'}', b']', b')', b'd', b'l', b't', 0x85, 0x86, 0x87, b'a', b'e', b's', b'u', b'q', b'r', 0x94, b'h', b'j', b'g',
    b'c', 0x93, b'R', 0x81, 0x92, b'b', b'Q', 0xff, 0x7f, 0x00,
];

fn mutate(rng: &mut Rng, data: &[u8]) -> Vec<u8> {
    let mut d = data.to_vec();
    for _ in 0..1 + rng.below(4) {
        match rng.below(6) {
            0 if !d.is_empty() => {
                let i = rng.below(d.len());
                d[i] ^= 1 << rng.below(8);
            }
            1 if !d.is_empty() => {
                let i = rng.below(d.len());
                d[i] = SPICE[rng.below(SPICE.len())];
            }
            2 => {
                let n = rng.below(d.len() + 1);
                d.truncate(n);
            }
            3 => {
                let i = rng.below(d.len() + 1);
                d.insert(i, SPICE[rng.below(SPICE.len())]);
            }
            4 if d.len() > 8 => {
                // Overwrite four bytes with a huge or boundary length.
                let i = rng.below(d.len() - 4);
                let v: u32 = [u32::MAX, 0x7fff_ffff, 0, 1, 0x1000_0000][rng.below(5)];
                d[i..i + 4].copy_from_slice(&v.to_le_bytes());
            }
            _ if !d.is_empty() => {
                // Duplicate a slice (repeated memo gets, nested containers).
                let a = rng.below(d.len());
                let b = (a + rng.below(64)).min(d.len());
                let chunk = d[a..b].to_vec();
                let at = rng.below(d.len());
                d.splice(at..at, chunk);
            }
            _ => {}
        }
    }
    d
}

fn read_all(f: &TorchFile) -> usize {
    let mut n = 0;
    fn walk(v: &Value, f: &TorchFile, n: &mut usize) {
        match v {
            Value::Tensor(t) => *n += usize::from(f.tensor(t, "t").is_ok()),
            Value::Dict(items) => items.iter().for_each(|(_, v)| walk(v, f, n)),
            Value::List(v) | Value::Tuple(v) => v.iter().for_each(|x| walk(x, f, n)),
            Value::Object { state, .. } => walk(state, f, n),
            _ => {}
        }
    }
    walk(&f.root, f, &mut n);
    n
}

#[test]
fn mutated_pickles_and_zips_never_panic() {
    let original = std::fs::read(shard()).unwrap();
    let pkl = {
        let mut z = zip::ZipArchive::new(std::io::Cursor::new(&original)).unwrap();
        let mut e = z.by_name("model_optim_rng/data.pkl").unwrap();
        let mut v = Vec::new();
        e.read_to_end(&mut v).unwrap();
        v
    };
    assert!(unpickle(&pkl, "data.pkl").is_ok());
    let budget = Duration::from_secs(std::env::var("FUZZ_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(8));
    let seed: u64 = std::env::var("FUZZ_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x5eed);
    let mut rng = Rng(seed | 1);
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("m.pt");
    let (mut pickles, mut zips, mut ok, mut errors, mut panics) = (0u64, 0u64, 0u64, 0u64, 0u64);
    let start = Instant::now();
    while start.elapsed() < budget {
        // Mostly pickles (cheap); one whole mutated archive through the file reader per 8.
        {
            let m = mutate(&mut rng, &pkl);
            pickles += 1;
            match catch_unwind(|| unpickle(&m, "fuzz.pkl").is_ok()) {
                Ok(true) => ok += 1,
                Ok(false) => errors += 1,
                Err(_) => {
                    panics += 1;
                    std::fs::write(tmp.path().join(format!("panic-{pickles}.pkl")), &m).unwrap();
                }
            }
        }
        if zips * 8 < pickles {
            let m = mutate(&mut rng, &original);
            zips += 1;
            std::fs::write(&path, &m).unwrap();
            match catch_unwind(AssertUnwindSafe(|| TorchFile::open(&path).map(|f| read_all(&f)))) {
                Ok(Ok(_)) => ok += 1,
                Ok(Err(_)) => errors += 1,
                Err(_) => {
                    panics += 1;
                    eprintln!("panic on a mutated archive (seed {seed}, case {zips})");
                }
            }
        }
    }
    println!(
        "fuzz (seed {seed:#x}, {:.1}s): {pickles} pickles + {zips} archives -> {ok} decoded, {errors} clean errors, {panics} panics",
        start.elapsed().as_secs_f64()
    );
    assert_eq!(panics, 0, "the reader panicked on {panics} mutated inputs");
    assert!(errors > 0 && ok + errors > 100);
}

#[test]
fn refused_globals_name_the_file_and_the_global() {
    // protocol 2: GLOBAL 'os system', (str,), REDUCE, STOP
    let evil = b"\x80\x02cos\nsystem\nq\x00X\x02\x00\x00\x00lsq\x01\x85q\x02Rq\x03.";
    let err = unpickle(evil, "ckpt/data.pkl").unwrap_err().to_string();
    assert!(err.contains("ckpt/data.pkl") && err.contains("os.system"), "{err}");
    let evil = b"\x80\x02cbuiltins\neval\nq\x00.";
    let err = unpickle(evil, "x.pkl").unwrap_err().to_string();
    assert!(err.contains("builtins.eval"), "{err}");
}

fn copy_tree(from: &std::path::Path, to: &std::path::Path) {
    for e in std::fs::read_dir(from).unwrap().flatten() {
        let dst = to.join(e.file_name());
        if e.path().is_dir() {
            std::fs::create_dir_all(&dst).unwrap();
            copy_tree(&e.path(), &dst);
        } else {
            std::fs::copy(e.path(), &dst).unwrap();
        }
    }
}

/// The torch_dist reader (mutated `.metadata` pickles and `.distcp` files) and the legacy
/// optimizer-state reader (mutated rank files with Megatron's Adam state): `Ok` or a clean
/// error, never a panic. `FUZZ2_SECONDS` sets the budget (default 5).
#[test]
fn mutated_torch_dist_and_optimizer_files_never_panic() {
    let fixture = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/megatron_tp4pp2");
    let tmp = tempfile::tempdir().unwrap();
    copy_tree(&fixture, tmp.path());
    let dist_dir = tmp.path().join("torch_dist");
    let legacy_dir = tmp.path().join("legacy");
    let targets = [
        dist_dir.join("iter_0000006/.metadata"),
        dist_dir.join("iter_0000006/__0_0.distcp"),
        dist_dir.join("iter_0000006/__5_0.distcp"),
        legacy_dir.join("iter_0000006/mp_rank_01_001/model_optim_rng.pt"),
    ];
    let originals: Vec<Vec<u8>> = targets.iter().map(|p| std::fs::read(p).unwrap()).collect();
    let budget = Duration::from_secs(std::env::var("FUZZ2_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(5));
    let seed: u64 = std::env::var("FUZZ_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x5eed);
    let mut rng = Rng(seed | 1);
    let (mut cases, mut ok, mut errors, mut panics) = ([0u64; 4], 0u64, 0u64, 0u64);
    let start = Instant::now();
    while start.elapsed() < budget {
        let k = rng.below(targets.len());
        let m = mutate(&mut rng, &originals[k]);
        std::fs::write(&targets[k], &m).unwrap();
        cases[k] += 1;
        let outcome = catch_unwind(AssertUnwindSafe(|| -> anyhow::Result<()> {
            if k < 3 {
                dist::open(&dist_dir, None)?.full_tensors(&mut |_, _| {})?;
            } else {
                let ck = legacy::open(&legacy_dir, None)?;
                read_optimizer(&ck)?;
                ck.full_tensors(&mut |_, _| {})?;
            }
            Ok(())
        }));
        match outcome {
            Ok(Ok(())) => ok += 1,
            Ok(Err(_)) => errors += 1,
            Err(_) => {
                panics += 1;
                std::fs::write(tmp.path().join(format!("panic-{k}-{}", cases[k])), &m).unwrap();
            }
        }
        std::fs::write(&targets[k], &originals[k]).unwrap();
    }
    println!(
        "fuzz torch_dist/optimizer (seed {seed:#x}, {:.1}s): {} .metadata + {} .distcp + {} optimizer rank files -> \
         {ok} read, {errors} clean errors, {panics} panics",
        start.elapsed().as_secs_f64(),
        cases[0],
        cases[1] + cases[2],
        cases[3]
    );
    assert_eq!(panics, 0, "a reader panicked on {panics} mutated inputs (kept in {})", tmp.path().display());
    assert!(errors > 0 && ok + errors > 20);
}

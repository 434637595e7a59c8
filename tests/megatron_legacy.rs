//! Megatron-LM legacy checkpoints (issue 20): the tp2 x pp2 GPT written by Megatron-LM's own
//! code (scripts/megatron_legacy_fixture.py; tests/fixtures/megatron_legacy_tp2pp2) gives the
//! logits and loss Megatron's model computed for a fixed batch, and `pretrain --load` of the
//! Megatron directory trains exactly as `--load` of its native conversion.

mod common;
use common::*;
use megatron::checkpoint_tools::convert::legacy_to_native;
use megatron::generate::{load_model, LoadArgs};
use megatron_core::{Model, Registry};
use serde_json::Value;
use std::path::PathBuf;

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/megatron_legacy_tp2pp2")
}

fn ints(v: &Value) -> Vec<i32> {
    v.as_array().unwrap().iter().map(|x| x.as_i64().unwrap() as i32).collect()
}

#[test]
fn megatron_tp2_pp2_checkpoint_gives_megatrons_logits_and_loss() {
    let tmp = tempfile::tempdir().unwrap();
    let ck = megatron_checkpoint_megatron::legacy::open(&fixture(), None).unwrap();
    legacy_to_native(&ck, tmp.path(), None, false).unwrap();
    let registry = Registry::builtin().unwrap();
    let mut loaded =
        load_model(&registry, &LoadArgs { load: tmp.path().into(), backend: "cpu".into(), ..Default::default() })
            .unwrap();
    assert_eq!(loaded.iteration, 10);
    let r: Value = serde_json::from_str(&std::fs::read_to_string(fixture().join("reference.json")).unwrap()).unwrap();
    let (b, s, v) = (
        r["batch"].as_u64().unwrap() as usize,
        r["seq"].as_u64().unwrap() as usize,
        r["vocab"].as_u64().unwrap() as usize,
    );
    let tokens = ints(&r["tokens"]);
    let labels = ints(&r["labels"]);
    let logits = loaded.model.logits(&tokens, b, s).unwrap();
    let logits = loaded.model.backend().to_host(&logits).unwrap().to_f32_vec();
    let vp = logits.len() / (b * s);
    assert_eq!(vp, 128);
    let want: Vec<f64> = r["logits"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
    let mut worst = 0f64;
    for row in 0..b * s {
        for c in 0..v {
            worst = worst.max((f64::from(logits[row * vp + c]) - want[row * v + c]).abs());
        }
    }
    // Cross entropy of the batch: ours from our logits (megatron-rs gives padded vocabulary ids
    // logit -inf, so they are out of the softmax), Megatron's from its logits over the true
    // vocabulary. (Megatron's own loss also lets the 28 padding ids into the softmax: `loss`.)
    let ce = |rows: &dyn Fn(usize) -> Vec<f64>| -> f64 {
        let mut loss = 0f64;
        for row in 0..b * s {
            let l = rows(row);
            let m = l.iter().fold(f64::MIN, |a, &x| a.max(x));
            let lse = m + l.iter().map(|&x| (x - m).exp()).sum::<f64>().ln();
            loss += lse - l[labels[row] as usize];
        }
        loss / (b * s) as f64
    };
    let ours = ce(&|row| logits[row * vp..(row + 1) * vp].iter().map(|&x| f64::from(x)).collect());
    let theirs = ce(&|row| want[row * v..(row + 1) * v].to_vec());
    println!(
        "max |logit ours - Megatron| = {worst:.3e}; loss ours {ours:.7}, Megatron's logits {theirs:.7} \
         (Megatron's padded-softmax loss {:.7})",
        r["loss"].as_f64().unwrap()
    );
    assert!(worst < 1e-4, "logits differ from Megatron-LM's by {worst:.3e}");
    assert!((ours - theirs).abs() < 1e-5, "loss {ours} vs Megatron-LM's {theirs}");
}

fn megatron_shaped(load: &str) -> Vec<String> {
    flags(&format!(
        "--num-layers 4 --hidden-size 32 --num-attention-heads 4 --group-query-attention --num-query-groups 2 \
         --ffn-hidden-size 48 --swiglu --seq-length 16 --max-position-embeddings 16 --micro-batch-size 2 \
         --global-batch-size 2 --lr 1e-3 --min-lr 1e-4 --lr-decay-style cosine --lr-warmup-iters 5 \
         --train-iters 14 --mock-data --vocab-size 100 --make-vocab-size-divisible-by 32 --hidden-dropout 0 \
         --attention-dropout 0 --seed 1234 --log-interval 1 --eval-iters 0 --no-load-optim --load {load}"
    ))
}

#[test]
fn pretrain_load_of_a_megatron_dir_trains_as_its_native_conversion() {
    let tmp = tempfile::tempdir().unwrap();
    let ck = megatron_checkpoint_megatron::legacy::open(&fixture(), None).unwrap();
    legacy_to_native(&ck, tmp.path(), None, false).unwrap();
    let from_megatron = pretrain(&megatron_shaped(fixture().to_str().unwrap())).unwrap();
    let from_native = pretrain(&megatron_shaped(tmp.path().to_str().unwrap())).unwrap();
    assert_eq!(from_megatron.losses.first().map(|l| l.0), Some(11), "resumes after iteration 10");
    assert_eq!(from_megatron.losses.len(), 4);
    for ((i, a), (_, b)) in from_megatron.losses.iter().zip(&from_native.losses) {
        assert_eq!(a.to_bits(), b.to_bits(), "iteration {i}: --load megatron {a} vs native {b}");
    }
    println!("losses after --load of the Megatron-LM dir: {:?}", from_megatron.losses);
}

#[test]
fn bad_megatron_checkpoints_are_clear_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("m");
    let copy = |from: &std::path::Path, to: &std::path::Path| {
        for e in walk(from) {
            let rel = e.strip_prefix(from).unwrap();
            let dst = to.join(rel);
            std::fs::create_dir_all(dst.parent().unwrap()).unwrap();
            std::fs::copy(&e, &dst).unwrap();
        }
    };
    copy(&fixture(), &dir);
    // A missing shard names the file and the grid.
    let victim = dir.join("iter_0000010/mp_rank_01_001/model_optim_rng.pt");
    std::fs::remove_file(&victim).unwrap();
    std::fs::remove_dir(victim.parent().unwrap()).unwrap();
    let err = format!("{:#}", megatron_checkpoint_megatron::legacy::open(&dir, None).err().unwrap());
    assert!(err.contains("mp_rank_01") || err.contains("tp2 x pp2"), "{err}");
    // A truncated shard names the file.
    copy(&fixture(), &dir);
    let bytes = std::fs::read(&victim).unwrap();
    std::fs::write(&victim, &bytes[..bytes.len() / 2]).unwrap();
    let err = format!("{:#}", megatron_checkpoint_megatron::legacy::open(&dir, None).err().unwrap());
    assert!(err.contains("mp_rank_01_001"), "{err}");
}

fn walk(dir: &std::path::Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        if e.path().is_dir() {
            out.extend(walk(&e.path()));
        } else {
            out.push(e.path());
        }
    }
    out
}

fn cli(args: &str) {
    use clap::Parser;
    let argv: Vec<String> =
        std::iter::once("megatron".to_string()).chain(args.split_whitespace().map(String::from)).collect();
    megatron::cli::run(megatron::cli::Cli::try_parse_from(argv).unwrap()).unwrap();
}

/// tp2 x pp2 (Megatron-LM's) -> legacy tp1 x pp4 -> legacy tp2 x pp1 -> native: every tensor
/// bit-identical to the original's reassembly (f32 throughout).
#[test]
fn convert_round_trip_through_other_layouts_is_bit_identical() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b, c) = (tmp.path().join("tp1pp4"), tmp.path().join("tp2pp1"), tmp.path().join("native"));
    let f = fixture();
    cli(&format!(
        "checkpoint convert --load {} --save {} --to megatron-legacy --target-tensor-parallel-size 1 --target-pipeline-parallel-size 4",
        f.display(),
        a.display()
    ));
    assert!(a.join("iter_0000010/mp_rank_00_003/model_optim_rng.pt").exists());
    cli(&format!(
        "checkpoint convert --load {} --save {} --to megatron-legacy --target-tensor-parallel-size 2 --target-pipeline-parallel-size 1",
        a.display(),
        b.display()
    ));
    assert!(b.join("iter_0000010/mp_rank_01/model_optim_rng.pt").exists());
    cli(&format!("checkpoint convert --load {} --save {}", b.display(), c.display()));
    let original = megatron_checkpoint_megatron::legacy::open(&f, None).unwrap().full_tensors(&mut |_, _| {}).unwrap();
    let mid = megatron_checkpoint_megatron::legacy::open(&a, None).unwrap();
    assert_eq!((mid.shape.tp, mid.shape.pp, mid.iteration()), (1, 4, 10));
    let native = megatron_checkpoint::load(&c, None).unwrap();
    let names: Vec<&str> = native.tensor_names().collect();
    assert_eq!(names.len(), original.len());
    for (name, t) in &original {
        let (data, shape) = native.tensor(name).unwrap();
        assert_eq!(&shape, &t.shape, "{name}");
        let want: Vec<u32> = t.to_f32().iter().map(|x| x.to_bits()).collect();
        let got: Vec<u32> = data.to_f32_vec().iter().map(|x| x.to_bits()).collect();
        assert!(want == got, "tensor `{name}` changed in the round trip");
    }
    assert_eq!(native.metadata.meta.lr_scheduler["num_steps"], 20);
}

//! Megatron-LM checkpoints, part 2 (issue 20): the tp4 x pp2 GPT-2-shaped model Megatron-LM
//! wrote in both formats (scripts/megatron_tp4pp2_fixture.py; tests/fixtures/megatron_tp4pp2)
//! through `checkpoint convert` to HF and back, the `torch_dist` copy loaded by `pretrain`, and
//! optimizer state carried through Megatron's legacy layout so a resumed run is bit-identical.

mod common;
use common::*;
use std::path::{Path, PathBuf};

fn fixture(sub: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/megatron_tp4pp2").join(sub)
}

fn cli(args: &str) {
    use clap::Parser;
    let argv: Vec<String> =
        std::iter::once("megatron".to_string()).chain(args.split_whitespace().map(String::from)).collect();
    megatron::cli::run(megatron::cli::Cli::try_parse_from(argv).unwrap()).unwrap();
}

/// Every tensor of the native checkpoint at `native` equals `original`'s bit for bit; with
/// `true_vocab`, vocabulary tensors only in their first `true_vocab` rows (HF keeps the true
/// vocabulary: padding rows are re-created on import).
fn assert_bit_identical(
    native: &Path,
    original: &std::collections::BTreeMap<String, megatron_checkpoint_megatron::TensorData>,
    true_vocab: Option<usize>,
) {
    let native = megatron_checkpoint::load(native, None).unwrap();
    let names: Vec<&str> =
        native.tensor_names().filter(|n| !n.starts_with(megatron_checkpoint::metadata::OPTIMIZER_PREFIX)).collect();
    assert_eq!(names.len(), original.len(), "{names:?}");
    for (name, t) in original {
        let (data, shape) = native.tensor(name).unwrap();
        assert_eq!(&shape, &t.shape, "{name}");
        let mut want: Vec<u32> = t.to_f32().iter().map(|x| x.to_bits()).collect();
        let mut got: Vec<u32> = data.to_f32_vec().iter().map(|x| x.to_bits()).collect();
        if let (Some(v), "embedding.word_embeddings.weight" | "output_layer.weight") = (true_vocab, name.as_str()) {
            want.truncate(v * t.shape[1]);
            got.truncate(v * t.shape[1]);
        }
        let first = want.iter().zip(&got).position(|(a, b)| a != b);
        assert!(
            first.is_none(),
            "tensor `{name}` {shape:?} changed in the round trip ({}): first difference at element {first:?}",
            native.dir().display()
        );
    }
}

/// Issue 20, shown item 3: Megatron's tp4 x pp2 -> legacy tp2 x pp1 -> native -> HF -> (import)
/// native: every tensor bit-identical to the tp4 x pp2 original's reassembly (f32 throughout).
#[test]
fn tp4_pp2_to_tp2_pp1_to_native_to_hf_and_back_is_bit_identical() {
    let tmp = tempfile::tempdir().unwrap();
    let p = |s: &str| tmp.path().join(s);
    let src = fixture("legacy");
    cli(&format!(
        "checkpoint convert --load {} --save {} --to megatron-legacy --target-tensor-parallel-size 2 \
         --target-pipeline-parallel-size 1",
        src.display(),
        p("tp2pp1").display()
    ));
    assert!(p("tp2pp1/iter_0000006/mp_rank_01/model_optim_rng.pt").exists());
    cli(&format!("checkpoint convert --load {} --save {}", p("tp2pp1").display(), p("native").display()));
    cli(&format!("checkpoint convert --load {} --save {} --to hf", p("native").display(), p("hf").display()));
    cli(&format!(
        "import hf --hf-dir {} --save {} --make-vocab-size-divisible-by 32",
        p("hf").display(),
        p("back").display()
    ));
    let original =
        megatron_checkpoint_megatron::legacy::open(&src, None).unwrap().full_tensors(&mut |_, _| {}).unwrap();
    assert_bit_identical(&p("native"), &original, None);
    assert_bit_identical(&p("back"), &original, Some(100));
    // The optimizer state went through tp2 x pp1 and into the native checkpoint.
    let native = megatron_checkpoint::load(&p("native"), None).unwrap();
    assert_eq!(native.metadata.optimizer["step"], 3);
    assert_eq!(native.tensor_names().filter(|n| n.ends_with(".exp_avg_sq")).count(), original.len());
}

/// The torch_dist copy converts to the same native tensors, and `pretrain --load` of the
/// torch_dist directory trains exactly as `--load` of the legacy one (weights only).
#[test]
fn pretrain_load_of_torch_dist_trains_as_the_legacy_copy() {
    let tmp = tempfile::tempdir().unwrap();
    cli(&format!("checkpoint convert --load {} --save {}", fixture("torch_dist").display(), tmp.path().display()));
    let original = megatron_checkpoint_megatron::legacy::open(&fixture("legacy"), None)
        .unwrap()
        .full_tensors(&mut |_, _| {})
        .unwrap();
    assert_bit_identical(tmp.path(), &original, None);
    let run = |load: &Path| {
        pretrain(&flags(&format!(
            "--num-layers 4 --hidden-size 32 --num-attention-heads 4 --ffn-hidden-size 64 --seq-length 16 \
             --max-position-embeddings 16 --micro-batch-size 2 --global-batch-size 2 --lr 1e-3 --min-lr 1e-4 \
             --lr-decay-style cosine --lr-warmup-iters 5 --train-iters 9 --mock-data --vocab-size 100 \
             --make-vocab-size-divisible-by 32 --hidden-dropout 0 --attention-dropout 0 --seed 1234 \
             --log-interval 1 --eval-iters 0 --no-load-optim --load {}",
            load.display()
        )))
        .unwrap()
    };
    let a = run(&fixture("torch_dist"));
    let b = run(&fixture("legacy"));
    assert_eq!(a.losses.first().map(|l| l.0), Some(7), "resumes after iteration 6");
    assert_eq!(a.losses.len(), 3);
    for ((i, x), (_, y)) in a.losses.iter().zip(&b.losses) {
        assert_eq!(x.to_bits(), y.to_bits(), "iteration {i}: torch_dist {x} vs legacy {y}");
    }
    println!("losses after --load of Megatron-Core's torch_dist dir: {:?}", a.losses);
}

/// Optimizer state through Megatron's legacy layout: a run of ours saved at iteration 4
/// (Adam moments after 4 steps), converted to Megatron legacy tp2 x pp2 and loaded back by
/// `pretrain --load` at tp1, continues with losses bit-identical to resuming the original;
/// without the optimizer state (`--no-load-optim`) it does not.
#[test]
fn resume_through_megatron_legacy_with_optimizer_state_is_bit_identical() {
    let tmp = tempfile::tempdir().unwrap();
    let save = tmp.path().join("ours");
    let base = "--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --max-position-embeddings 16 \
                --micro-batch-size 2 --global-batch-size 4 --lr 3e-3 --min-lr 3e-4 --lr-decay-style cosine \
                --lr-warmup-iters 2 --mock-data --vocab-size 100 --seed 7 --log-interval 1 --eval-iters 0 \
                --hidden-dropout 0 --attention-dropout 0 --weight-decay 0.1 --lr-decay-iters 7";
    pretrain(&flags(&format!("{base} --train-iters 4 --save {} --save-interval 4", save.display()))).unwrap();
    let mega = tmp.path().join("megatron");
    cli(&format!(
        "checkpoint convert --load {} --save {} --to megatron-legacy --target-tensor-parallel-size 2 \
         --target-pipeline-parallel-size 2",
        save.display(),
        mega.display()
    ));
    let ck = megatron_checkpoint_megatron::legacy::open(&mega, None).unwrap();
    assert!(ck.optimizer_summary().starts_with("Adam at step 4"), "{}", ck.optimizer_summary());
    // The first run's schedule is stored (decay over 7 iterations); resuming keeps it.
    let resume = |load: &Path, extra: &str| {
        pretrain(&flags(&format!(
            "{base} --train-iters 7 --use-checkpoint-opt_param-scheduler --load {} {extra}",
            load.display()
        )))
        .unwrap()
        .losses
    };
    let original = resume(&save, "");
    let through_megatron = resume(&mega, "");
    let without_optim = resume(&mega, "--no-load-optim");
    assert_eq!(original.first().map(|l| l.0), Some(5));
    for ((i, a), (_, b)) in original.iter().zip(&through_megatron) {
        assert_eq!(a.to_bits(), b.to_bits(), "iteration {i}: original {a} vs through Megatron legacy {b}");
    }
    assert_ne!(original.last(), without_optim.last(), "the optimizer state made no difference");
    println!(
        "resumed losses (original = through Megatron legacy tp2 x pp2): {original:?}; fresh Adam: {without_optim:?}"
    );
}

//! A small BERT pretraining run on a sentence-split dataset (tiny Shakespeare in
//! `scripts/bert_pretrain_shakespeare.sh`): Megatron's `BERTMaskedWordPieceDataset` samples
//! (`megatron_datasets::bert`), the `bert` model with the binary head, Adam with linear warmup
//! and cosine decay, gradient clipping at 1.0; prints `lm loss` and `sop loss` (Megatron's
//! per-microbatch means, averaged over the global batch) every `LOG` iterations.
//!
//! ```text
//! cargo run --release -p megatron-bert --example pretrain_shakespeare -- PREFIX VOCAB \
//!     [ITERS=300] [SEQ=64] [GLOBAL_BATCH=16] [HIDDEN=128] [LAYERS=2] [LOG=10]
//! ```
//! Not yet `megatron pretrain --model bert`: the driver's `Batch` has no token types,
//! padding lengths or sentence-order labels.

use anyhow::{Context, Result};
use megatron_bert::{BertBatch, BertConfig, BertModel};
use megatron_core::{AdamStep, Backend, DType, Mode, ParallelContext};
use megatron_cpu::CpuBackend;
use megatron_datasets::bert::{masking_vocab_from_file, BertDatasetConfig, BertMaskedDataset};
use megatron_datasets::IndexedDataset;
use std::path::Path;
use std::sync::Arc;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize, d: usize| -> Result<usize> {
        args.get(i).map(|s| s.parse().with_context(|| format!("argument {}: {s:?}", i + 1))).unwrap_or(Ok(d))
    };
    let (prefix, vocab_path) = (args.first().context("PREFIX")?, args.get(1).context("VOCAB")?);
    let (iters, seq, gbs, hidden, layers, log) =
        (arg(2, 300)?, arg(3, 64)?, arg(4, 16)?, arg(5, 128)?, arg(6, 2)?, arg(7, 10)?);
    let mbs = 8.min(gbs);
    let vocab = masking_vocab_from_file(Path::new(vocab_path))?;
    let vocab_size = vocab.is_subword.len();
    let data = IndexedDataset::open(prefix)?;
    let docs = 0..data.num_documents();
    let dcfg = BertDatasetConfig {
        sequence_length: seq,
        seed: 1234,
        masking_probability: 0.15,
        short_sequence_probability: 0.1,
        classification_head: true,
        num_samples: Some((iters * gbs) as u64),
        pad_id: 0,
    };
    let ds = BertMaskedDataset::new(data, docs, vocab, dcfg)?;
    let cfg = BertConfig {
        num_layers: layers,
        hidden_size: hidden,
        num_attention_heads: (hidden / 64).max(2),
        max_position_embeddings: seq,
        vocab_size,
        seed: 1234,
        ..Default::default()
    };
    let bk: Arc<dyn Backend> = Arc::new(CpuBackend::new());
    let mut model = BertModel::new(cfg, bk.clone(), ParallelContext::single())?;
    let mut moments = model
        .params()
        .iter()
        .map(|p| Ok((bk.zeros(p.value.shape(), DType::F32)?, bk.zeros(p.value.shape(), DType::F32)?)))
        .collect::<Result<Vec<_>>>()?;
    let (lr_max, lr_min, warmup) = (1e-3f32, 1e-4f32, iters / 10);
    let t0 = std::time::Instant::now();
    let (mut lm_acc, mut sop_acc) = (0.0f64, 0.0f64);
    println!(
        "{} samples in the index; {} parameters",
        ds.len(),
        model.params().iter().map(|p| p.value.numel()).sum::<usize>()
    );
    for it in 0..iters {
        model.zero_grads()?;
        let micro = gbs / mbs;
        let (mut lm, mut sop) = (0.0, 0.0);
        for m in 0..micro {
            let first = it * gbs + m * mbs;
            let mut x = BertBatch {
                batch: mbs,
                seq,
                tokens: vec![],
                types: vec![],
                lengths: vec![],
                labels: vec![],
                loss_mask: vec![],
                is_random: vec![],
                seed: (it * 1000 + m) as u64,
            };
            for i in first..first + mbs {
                let s = ds.get(i)?;
                x.tokens.extend(s.text.iter().map(|&v| v as i32));
                x.types.extend(s.types.iter().map(|&v| v as i32));
                x.lengths.push(s.length());
                x.labels.extend(s.labels.iter().zip(&s.loss_mask).map(|(&l, &m)| if m == 1 { l as i32 } else { 0 }));
                x.loss_mask.extend(s.loss_mask.iter().map(|&m| m as f32));
                x.is_random.push(s.is_random as i32);
            }
            let l = model.forward_bert(&x, Mode::Train)?;
            lm += l.lm_loss_sum / l.lm_tokens / micro as f64;
            sop += l.sop_loss_sum / l.sop_rows / micro as f64;
            model.backward_bert((1.0 / l.lm_tokens / micro as f64) as f32, (1.0 / l.sop_rows / micro as f64) as f32)?;
        }
        // Clip the global norm to 1.0, then Adam (weight decay 0.01 on matrices only).
        let norm = model.params().iter().map(|p| bk.sum_squares(&p.grad)).sum::<Result<f64>>()?.sqrt();
        let clip = if norm > 1.0 { (1.0 / norm) as f32 } else { 1.0 };
        let lr = if it < warmup {
            lr_max * (it + 1) as f32 / warmup as f32
        } else {
            let t = (it - warmup) as f32 / (iters - warmup).max(1) as f32;
            lr_min + 0.5 * (lr_max - lr_min) * (1.0 + (std::f32::consts::PI * t).cos())
        };
        for (p, (m1, m2)) in model.params_mut().into_iter().zip(moments.iter_mut()) {
            if clip < 1.0 {
                bk.scale(&mut p.grad, clip)?;
            }
            let wd = if p.layout.no_weight_decay { 0.0 } else { 0.01 };
            let step = AdamStep { lr, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: wd, step: it as u64 + 1 };
            bk.adam_step(&mut p.value, &p.grad, m1, m2, step)?;
        }
        lm_acc += lm;
        sop_acc += sop;
        if (it + 1) % log == 0 {
            println!(
                " iteration {:5}/{iters} | lr {lr:.3e} | lm loss {:.4} | sop loss {:.4} | grad norm {norm:.3} | {:.0} ms/iter",
                it + 1,
                lm_acc / log as f64,
                sop_acc / log as f64,
                t0.elapsed().as_secs_f64() * 1000.0 / (it + 1) as f64
            );
            (lm_acc, sop_acc) = (0.0, 0.0);
        }
    }
    Ok(())
}

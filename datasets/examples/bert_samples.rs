//! Dumps BERT samples of a sentence-split `.bin/.idx` as JSON lines (Megatron's keys), or the
//! mask statistics of many samples, for `scripts/bert_dataset_exactness.sh`:
//!
//! ```text
//! cargo run --release -p megatron-datasets --example bert_samples -- PREFIX VOCAB SEQ SEED \
//!     NUM_SAMPLES COUNT (samples OUT.jsonl | stats) [--bert-no-binary-head]
//! ```

use anyhow::{bail, Context, Result};
use megatron_datasets::bert::{masking_vocab_from_file, BertDatasetConfig, BertMaskedDataset};
use megatron_datasets::IndexedDataset;
use std::io::Write;
use std::path::Path;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 7 {
        bail!("usage: bert_samples PREFIX VOCAB SEQ SEED NUM_SAMPLES COUNT (samples OUT.jsonl | stats) [--bert-no-binary-head]");
    }
    let num =
        |i: usize| -> Result<u64> { args[i].parse().with_context(|| format!("argument {} = {:?}", i + 1, args[i])) };
    let data = IndexedDataset::open(&args[0])?;
    let vocab = masking_vocab_from_file(Path::new(&args[1]))?;
    let config = BertDatasetConfig {
        sequence_length: num(2)? as usize,
        seed: num(3)? as u32,
        masking_probability: 0.15,
        short_sequence_probability: 0.1,
        classification_head: !args.iter().any(|a| a == "--bert-no-binary-head"),
        num_samples: Some(num(4)?),
        pad_id: 0,
    };
    let docs = 0..data.num_documents();
    let ds = BertMaskedDataset::new(data, docs, vocab.clone(), config)?;
    let count = (num(5)? as usize).min(ds.len());
    eprintln!("{} samples in the index", ds.len());
    match args[6].as_str() {
        "samples" => {
            let out = args.get(7).context("samples needs an output path")?;
            let mut f = std::io::BufWriter::new(std::fs::File::create(out)?);
            for i in 0..count {
                let s = ds.get(i)?;
                let v = serde_json::json!({
                    "text": s.text, "types": s.types, "labels": s.labels, "is_random": s.is_random,
                    "padding_mask": s.padding_mask, "loss_mask": s.loss_mask, "truncated": s.truncated,
                });
                writeln!(f, "{v}")?;
            }
        }
        "stats" => {
            let (mut real, mut masked, mut as_mask, mut kept, mut random, mut swapped, mut trunc) =
                (0u64, 0u64, 0u64, 0u64, 0u64, 0u64, 0u64);
            for i in 0..count {
                let s = ds.get(i)?;
                // Candidates: real tokens that are not [CLS]/[SEP] (a masked position's label).
                real += s.padding_mask.iter().zip(&s.text).filter(|&(&m, _)| m == 1).count() as u64;
                real -= s
                    .text
                    .iter()
                    .zip(&s.padding_mask)
                    .filter(|&(&t, &m)| m == 1 && (t == vocab.cls || t == vocab.sep))
                    .count() as u64;
                for p in (0..s.text.len()).filter(|&p| s.loss_mask[p] == 1) {
                    masked += 1;
                    if s.text[p] == vocab.mask {
                        as_mask += 1;
                    } else if s.text[p] == s.labels[p] {
                        kept += 1;
                    } else {
                        random += 1;
                    }
                }
                swapped += s.is_random as u64;
                trunc += s.truncated as u64;
            }
            let pct = |a: u64, b: u64| 100.0 * a as f64 / b.max(1) as f64;
            println!("samples {count}: masked {masked} of {real} word pieces ({:.2}%)", pct(masked, real));
            println!(
                "  [MASK] {:.2}%  random {:.2}%  unchanged {:.2}%",
                pct(as_mask, masked),
                pct(random, masked),
                pct(kept, masked)
            );
            println!(
                "  is_random (swapped order) {:.2}%  truncated {:.2}%",
                pct(swapped, count as u64),
                pct(trunc, count as u64)
            );
        }
        other => bail!("unknown mode {other:?}: samples or stats"),
    }
    Ok(())
}

//! `megatron data inspect PREFIX --model t5`: the span-corruption samples Megatron's
//! `T5MaskedWordPieceDataset` draws from a sentence-split prefix (BERT WordPiece vocabulary
//! with `--vocab-extra-ids` sentinels): the split's documents, the sample index size, the first
//! samples decoded (encoder input with its sentinels, decoder input, labels) and, with
//! `--stats N`, the masked fraction and mean span length over the first N samples next to the
//! configured masking probability.

use super::data_inspect::InspectArgs;
use anyhow::{anyhow, bail, Context, Result};
use megatron_core::{Registry, Tokenizer};
use megatron_datasets::split::{split_ranges, SPLIT_NAMES};
use megatron_datasets::t5::plugin::bert_t5_vocab;
use megatron_datasets::t5::{T5Dataset, T5DatasetConfig};
use megatron_datasets::IndexedDataset;
use std::fmt::Write;
use std::sync::Arc;

/// Decoded ids with the sentinels and special ids named (`<extra_id_k>`, `[BOS]`, `[EOS]`).
fn show(tok: &dyn Tokenizer, ids: &[i64], bos: i64, eos: i64, first_sentinel: i64) -> Result<String> {
    let mut out = Vec::new();
    let mut run: Vec<u32> = Vec::new();
    let flush = |run: &mut Vec<u32>, out: &mut Vec<String>| -> Result<()> {
        if !run.is_empty() {
            out.push(tok.decode(run)?);
            run.clear();
        }
        Ok(())
    };
    for &t in ids {
        let special = if t == bos {
            Some("[BOS]".to_string())
        } else if t == eos {
            Some("[EOS]".to_string())
        } else if t >= first_sentinel {
            Some(format!("<extra_id_{}>", t - first_sentinel))
        } else {
            None
        };
        match special {
            Some(s) => {
                flush(&mut run, &mut out)?;
                out.push(s);
            }
            None => run.push(t as u32),
        }
    }
    flush(&mut run, &mut out)?;
    Ok(out.join(" "))
}

/// The report of `megatron data inspect --model t5`.
pub fn inspect(a: &InspectArgs, registry: &Registry) -> Result<String> {
    let k = SPLIT_NAMES
        .iter()
        .position(|s| *s == a.split)
        .ok_or_else(|| anyhow!("--split {:?}: expected one of train, valid, test", a.split))?;
    let vocab_file = a.tokenizer.vocab_file.as_ref().context("--model t5 needs --vocab-file (BERT vocab.txt)")?;
    let extra = a.tokenizer.vocab_extra_ids.context("--model t5 needs --vocab-extra-ids (Megatron uses 100)")?;
    let seed = i32::try_from(a.seed).map_err(|_| anyhow!("--seed {} must fit in 31 bits", a.seed))?;
    let ty = a.tokenizer.tokenizer_type.clone().unwrap_or_else(|| "BertWordPieceLowerCase".into());
    let tok = registry
        .tokenizer(&ty, a.tokenizer.flags().config())
        .with_context(|| format!("building tokenizer {ty} from --vocab-file/--vocab-extra-ids"))?;
    let data = Arc::new(IndexedDataset::open(&a.prefix)?);
    let vocab = Arc::new(bert_t5_vocab(vocab_file, extra)?);
    if tok.vocab_size() != vocab.continuation.len() {
        bail!("tokenizer {ty} has {} ids, the t5 vocabulary {}", tok.vocab_size(), vocab.continuation.len());
    }
    let n_docs = data.document_indices().len().saturating_sub(1);
    let docs = split_ranges(&a.split_string, n_docs)?[k]
        .clone()
        .filter(|r| !r.is_empty())
        .ok_or_else(|| anyhow!("--split-string {:?} gives the {} split no documents", a.split_string, a.split))?;
    let (se, sd) = (a.seq_length, a.decoder_seq_length);
    let wanted = a.num_samples.unwrap_or(1).max(a.stats as u64);
    let config = T5DatasetConfig::new(se, sd, seed, wanted);
    let ds = T5Dataset::new(data.clone(), docs.clone(), vocab.clone(), config.clone())?;
    let mut out = String::new();
    let w = &mut out;
    writeln!(w, "dataset      {} (t5 span corruption)", a.prefix)?;
    writeln!(
        w,
        "documents    {n_docs}; split {} of {:?}: documents [{}, {})",
        a.split, a.split_string, docs.start, docs.end
    )?;
    writeln!(
        w,
        "samples      {} (encoder {se}, decoder {sd}, seed {seed}, mask prob {}, short seq prob {}, max ngram {})",
        ds.sample_index().len(),
        config.masking_probability,
        config.short_seq_prob,
        config.max_ngram
    )?;
    let first = vocab.sentinels[0];
    for i in 0..a.show.min(ds.sample_index().len()) {
        let s = ds.sample(i)?;
        let enc_len = s.enc_mask.iter().filter(|&&m| m > 0).count();
        let dec_len = s.loss_mask.iter().filter(|&&m| m > 0).count();
        writeln!(w, "sample {i}     encoder {enc_len} tokens, decoder {dec_len}, truncated {}", s.truncated)?;
        writeln!(w, "  encoder    {}", show(tok.as_ref(), &s.text_enc[..enc_len], vocab.bos, vocab.eos, first)?)?;
        writeln!(w, "  decoder    {}", show(tok.as_ref(), &s.text_dec[..dec_len], vocab.bos, vocab.eos, first)?)?;
        writeln!(w, "  labels     {}", show(tok.as_ref(), &s.labels[..dec_len], vocab.bos, vocab.eos, first)?)?;
    }
    if a.stats > 0 {
        // Masked tokens are the decoder input minus [BOS] and the sentinels; the text is the
        // encoder's tokens minus its sentinels plus the masked ones.
        let n = a.stats.min(ds.sample_index().len());
        let (mut masked, mut real, mut spans) = (0usize, 0usize, 0usize);
        for i in 0..n {
            let s = ds.sample(i)?;
            let sentinels = s.text_dec.iter().filter(|&&t| t >= first).count();
            let dec_len = s.loss_mask.iter().filter(|&&m| m > 0).count();
            let enc_len = s.enc_mask.iter().filter(|&&m| m > 0).count();
            masked += dec_len - 1 - sentinels;
            real += enc_len - sentinels + dec_len - 1 - sentinels;
            spans += sentinels;
        }
        writeln!(
            w,
            "stats        {n} samples: masked fraction {:.4} (configured {}), {spans} spans, mean span length {:.3} tokens",
            masked as f64 / real.max(1) as f64,
            config.masking_probability,
            masked as f64 / spans.max(1) as f64
        )?;
    }
    Ok(out)
}

//! `megatron data inspect PREFIX --model bert`: the BERT samples Megatron's
//! `BERTMaskedWordPieceDataset` draws from a sentence-split prefix (documents split with
//! `--split-string`, `--seq-length`, `--seed`, `--num-samples`, `--bert-no-binary-head`):
//! the sample-index size, then the first samples decoded with the segments, `is_random`, and
//! every masked position shown as `[what the model sees→the label]`.

use super::data_inspect::InspectArgs;
use anyhow::{anyhow, Context, Result};
use megatron_core::Tokenizer;
use megatron_datasets::bert::{masking_vocab_from_file, BertDatasetConfig, BertMaskedDataset};
use megatron_datasets::split::{split_ranges, SPLIT_NAMES};
use megatron_datasets::IndexedDataset;
use std::fmt::Write;

fn piece(tok: &dyn Tokenizer, id: i64) -> Result<String> {
    tok.decode(&[id as u32])
}

pub fn inspect(a: &InspectArgs, tok: Option<&dyn Tokenizer>) -> Result<String> {
    let tok = tok.context("--model bert needs --tokenizer-type BertWordPieceLowerCase (or Case) and --vocab-file")?;
    let vocab_file = a.tokenizer.vocab_file.as_ref().context("--model bert needs --vocab-file vocab.txt")?;
    let vocab = masking_vocab_from_file(vocab_file)?;
    let k = SPLIT_NAMES.iter().position(|s| *s == a.split).ok_or_else(|| anyhow!("--split {:?}", a.split))?;
    let data = IndexedDataset::open(&a.prefix)?;
    let docs = split_ranges(&a.split_string, data.num_documents())?[k]
        .clone()
        .filter(|r| !r.is_empty())
        .ok_or_else(|| anyhow!("--split-string {:?} gives the {} split no documents", a.split_string, a.split))?;
    let mut out = String::new();
    let w = &mut out;
    writeln!(w, "dataset      {} ({} documents, {} sentences)", a.prefix, data.num_documents(), data.len())?;
    writeln!(w, "split        {} of {:?}: documents [{}, {})", a.split, a.split_string, docs.start, docs.end)?;
    let config = BertDatasetConfig {
        sequence_length: a.seq_length,
        seed: u32::try_from(a.seed).map_err(|_| anyhow!("--seed {} must fit in 32 bits", a.seed))?,
        masking_probability: 0.15,
        short_sequence_probability: 0.1,
        classification_head: !a.bert_no_binary_head,
        num_samples: a.num_samples,
        pad_id: 0,
    };
    let ds = BertMaskedDataset::new(data, docs, vocab, config)?;
    writeln!(w, "samples      {} of seq_length {} (binary head: {})", ds.len(), a.seq_length, !a.bert_no_binary_head)?;
    for i in 0..a.show.min(ds.len()) {
        let s = ds.get(i)?;
        let [beg, end, target] = ds.sample_index()[i];
        let len = s.length();
        let masked = s.loss_mask.iter().filter(|&&m| m == 1).count();
        writeln!(
            w,
            "sample {i}     sentences [{beg}, {end}) target {target} | {len} tokens, {masked} masked | is_random {} | truncated {}",
            s.is_random, s.truncated
        )?;
        let mut text = Vec::new();
        for p in 0..len {
            let mut t = piece(tok, s.text[p])?;
            if s.loss_mask[p] == 1 {
                t = format!("[{t}→{}]", piece(tok, s.labels[p])?);
            }
            if p > 0 && s.types[p] != s.types[p - 1] {
                text.push("|".to_string());
            }
            text.push(t);
        }
        writeln!(w, "  text       {}", text.join(" "))?;
    }
    Ok(out)
}

//! Encode throughput (MB/s, one thread) of the GPT-2 and BERT tokenizers on tiny Shakespeare
//! split into paragraphs and repeated to ~10 MB: the same input as `bench/hf_encode.py`, which
//! measures Hugging Face `tokenizers` for comparison. Run:
//! `cargo bench -p megatron-tokenizers --bench encode` (then `python3 tokenizers/bench/hf_encode.py`).
//! Skips when `shared/data` is absent.

use megatron_core::Tokenizer;
use megatron_tokenizers::{BertWordPieceTokenizer, Gpt2BpeTokenizer};
use std::path::PathBuf;
use std::time::Instant;

/// Paragraphs (split at blank lines, like `hf_encode.py`'s `re.split(r"\n\s*\n")`).
fn paragraphs(text: &str) -> Vec<String> {
    let mut out = vec![];
    let mut cur = String::new();
    for line in text.split_inclusive('\n') {
        if line.trim().is_empty() {
            if !cur.trim().is_empty() {
                out.push(cur.trim_end_matches('\n').to_string());
            }
            cur.clear();
        } else {
            cur.push_str(line);
        }
    }
    if !cur.trim().is_empty() {
        out.push(cur.trim_end_matches('\n').to_string());
    }
    out
}

fn measure(name: &str, tok: &dyn Tokenizer, docs: &[String], size: usize) -> anyhow::Result<()> {
    let start = Instant::now();
    let mut n = 0;
    for d in docs {
        n += tok.encode(d)?.len();
    }
    let dt = start.elapsed().as_secs_f64();
    println!(
        "megatron-rs {name:<13} encode per doc: {:7.2} MB/s ({size} bytes, {} docs, {n} ids, {dt:.2} s)",
        size as f64 / dt / 1e6,
        docs.len()
    );
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let Some(data) = manifest.ancestors().map(|a| a.join("shared/data")).find(|d| d.join("gpt2/vocab.json").is_file())
    else {
        println!("SKIP: shared/data not found above {}", manifest.display());
        return Ok(());
    };
    let mb: f64 = std::env::var("ENCODE_BENCH_MB").ok().and_then(|v| v.parse().ok()).unwrap_or(10.0);
    let text = std::fs::read_to_string(data.join("tinyshakespeare.txt"))?;
    let paras = paragraphs(&text);
    let (mut docs, mut size) = (vec![], 0);
    while (size as f64) < mb * 1e6 {
        for p in &paras {
            size += p.len();
            docs.push(p.clone());
        }
    }
    let start = Instant::now();
    let mut pieces = 0usize;
    for d in &docs {
        megatron_tokenizers::pretokenize::for_each_piece(d, |_| pieces += 1);
    }
    let dt = start.elapsed().as_secs_f64();
    println!("megatron-rs gpt2 pre-tokenizer only:   {:7.2} MB/s ({pieces} pieces)", size as f64 / dt / 1e6);
    let gpt2 = Gpt2BpeTokenizer::from_files(&data.join("gpt2/vocab.json"), &data.join("gpt2/merges.txt"))?;
    measure("gpt2", &gpt2, &docs, size)?;
    let bert = BertWordPieceTokenizer::from_file(&data.join("bert-base-uncased/vocab.txt"), true, 0)?;
    measure("bert-uncased", &bert, &docs, size)?;
    Ok(())
}

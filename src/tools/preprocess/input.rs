//! Reading the preprocessing input as a stream of records (one record = one document before
//! encoding), one line at a time so the whole file is never in memory.
//!
//! Formats (`--input-format`, `auto` by extension after removing a `.gz` suffix):
//! * `jsonl` (`.jsonl`, `.json`, `.ndjson`): Megatron's "loose JSON", one object per line. Every
//!   line is a record, blank lines included (they are bad lines, as in Megatron).
//! * `text-lines` (`.txt`): every non-blank line is one document; blank (whitespace-only)
//!   lines are skipped and counted.
//! * `text-paragraphs`: paragraphs separated by one or more blank lines are documents; a
//!   paragraph is its lines joined by `\n` (no trailing newline). This is how
//!   `tinyshakespeare.jsonl` was made from `tinyshakespeare.txt`.
//!
//! Lines end at `\n`; a `\r` before it is dropped (LF and CRLF files read alike). Files ending
//! in `.gz` are decompressed on the fly (multi-member gzip included).

use anyhow::{bail, Context, Result};
use clap::ValueEnum;
use flate2::read::MultiGzDecoder;
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

/// `--input-format`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum InputFormat {
    Auto,
    Jsonl,
    TextLines,
    TextParagraphs,
}

impl InputFormat {
    /// The concrete format of `path` (`Auto` resolved by extension).
    pub fn resolve(self, path: &Path) -> Result<InputFormat> {
        if self != InputFormat::Auto {
            return Ok(self);
        }
        let name = path.file_name().map(|n| n.to_string_lossy().to_lowercase()).unwrap_or_default();
        let name = name.strip_suffix(".gz").unwrap_or(&name);
        let ext = name.rsplit_once('.').map(|(_, e)| e).unwrap_or("");
        match ext {
            "jsonl" | "json" | "ndjson" => Ok(InputFormat::Jsonl),
            "txt" => Ok(InputFormat::TextLines),
            _ => bail!(
                "cannot tell the format of `{}` from its extension; pass --input-format jsonl, text-lines or \
                 text-paragraphs",
                path.display()
            ),
        }
    }
}

/// One document's raw input.
pub struct Record {
    /// 1-based line number of its (first) line.
    pub line: u64,
    /// The JSON line, text line or paragraph, without its line terminator. `Err` holds the
    /// reason the bytes are unusable (invalid UTF-8), reported as a bad line.
    pub text: std::result::Result<String, String>,
    /// Input bytes consumed by the record (for MB/s).
    pub bytes: u64,
}

/// Streams records out of one input file.
pub struct RecordReader {
    path: PathBuf,
    format: InputFormat,
    input: Box<dyn BufRead + Send>,
    line: u64,
    buf: Vec<u8>,
    /// Blank lines skipped by the text formats.
    pub blank_lines: u64,
}

impl RecordReader {
    pub fn open(path: &Path, format: InputFormat) -> Result<RecordReader> {
        let format = format.resolve(path)?;
        let file = File::open(path).with_context(|| format!("cannot open --input `{}`", path.display()))?;
        let gz = path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gz"));
        let input: Box<dyn BufRead + Send> = if gz {
            Box::new(BufReader::with_capacity(1 << 20, MultiGzDecoder::new(BufReader::new(file))))
        } else {
            Box::new(BufReader::with_capacity(1 << 20, file))
        };
        Ok(RecordReader { path: path.to_path_buf(), format, input, line: 0, buf: Vec::new(), blank_lines: 0 })
    }

    pub fn format(&self) -> InputFormat {
        self.format
    }

    /// Reads the next line into `self.buf` (terminator removed); `None` at the end.
    fn next_line(&mut self) -> Result<Option<u64>> {
        self.buf.clear();
        let n = self
            .input
            .read_until(b'\n', &mut self.buf)
            .with_context(|| format!("cannot read `{}` after line {}", self.path.display(), self.line))?;
        if n == 0 {
            return Ok(None);
        }
        self.line += 1;
        if self.buf.last() == Some(&b'\n') {
            self.buf.pop();
        }
        if self.buf.last() == Some(&b'\r') {
            self.buf.pop();
        }
        Ok(Some(n as u64))
    }

    fn is_blank(&self) -> bool {
        match std::str::from_utf8(&self.buf) {
            Ok(s) => s.trim().is_empty(),
            Err(_) => false,
        }
    }

    fn take_text(&self) -> std::result::Result<String, String> {
        String::from_utf8(self.buf.clone()).map_err(|e| format!("the line is not valid UTF-8 ({e})"))
    }

    /// The next record, or `None` at the end of the input.
    pub fn next_record(&mut self) -> Result<Option<Record>> {
        match self.format {
            InputFormat::Jsonl => {
                let Some(bytes) = self.next_line()? else { return Ok(None) };
                Ok(Some(Record { line: self.line, text: self.take_text(), bytes }))
            }
            InputFormat::TextLines => loop {
                let Some(bytes) = self.next_line()? else { return Ok(None) };
                if self.is_blank() {
                    self.blank_lines += 1;
                    continue;
                }
                return Ok(Some(Record { line: self.line, text: self.take_text(), bytes }));
            },
            InputFormat::TextParagraphs => self.next_paragraph(),
            InputFormat::Auto => unreachable!("resolved in RecordReader::open"),
        }
    }

    fn next_paragraph(&mut self) -> Result<Option<Record>> {
        let mut first_line = 0;
        let mut bytes = 0;
        let mut text: std::result::Result<String, String> = Ok(String::new());
        loop {
            let Some(n) = self.next_line()? else { break };
            bytes += n;
            if self.is_blank() {
                if first_line == 0 {
                    continue; // blank lines before the paragraph
                }
                break;
            }
            if first_line == 0 {
                first_line = self.line;
            } else if let Ok(t) = &mut text {
                t.push('\n');
            }
            match (&mut text, std::str::from_utf8(&self.buf)) {
                (Ok(t), Ok(s)) => t.push_str(s),
                (Ok(_), Err(e)) => text = Err(format!("line {} is not valid UTF-8 ({e})", self.line)),
                (Err(_), _) => {}
            }
        }
        Ok((first_line > 0).then_some(Record { line: first_line, text, bytes }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn records(content: &[u8], format: InputFormat) -> Result<Vec<(u64, String)>> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("in.txt");
        std::fs::write(&path, content)?;
        let mut r = RecordReader::open(&path, format)?;
        let mut out = vec![];
        while let Some(rec) = r.next_record()? {
            out.push((rec.line, rec.text.unwrap_or_else(|e| format!("ERR {e}"))));
        }
        Ok(out)
    }

    #[test]
    fn formats_split_records_as_documented() -> Result<()> {
        let text = b"\nA b\r\nc\n \n\nd\n\xff\n";
        let lines = records(text, InputFormat::TextLines)?;
        assert_eq!(lines[..3], [(2, "A b".into()), (3, "c".into()), (6, "d".into())]);
        assert!(lines[3].1.starts_with("ERR") && lines[3].0 == 7);
        let paras = records(text, InputFormat::TextParagraphs)?;
        assert_eq!(paras[0], (2, "A b\nc".into()));
        assert_eq!(paras[1].0, 6);
        assert!(paras[1].1.contains("line 7 is not valid UTF-8"));
        let json = records(b"{}\n\n{}", InputFormat::Jsonl)?;
        assert_eq!(json, [(1, "{}".into()), (2, "".into()), (3, "{}".into())]);
        Ok(())
    }

    #[test]
    fn auto_format_follows_the_extension() {
        let r = |p: &str| InputFormat::Auto.resolve(Path::new(p)).ok();
        assert_eq!(r("a/b.jsonl.gz"), Some(InputFormat::Jsonl));
        assert_eq!(r("b.JSON"), Some(InputFormat::Jsonl));
        assert_eq!(r("c.txt"), Some(InputFormat::TextLines));
        assert_eq!(r("d.csv"), None);
        assert_eq!(InputFormat::TextParagraphs.resolve(Path::new("x.csv")).ok(), Some(InputFormat::TextParagraphs));
    }
}

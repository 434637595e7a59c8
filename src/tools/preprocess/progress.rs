//! The progress line of `megatron preprocess`, printed to stderr every `--log-interval`
//! documents in Megatron's words: `Processed N documents (D docs/s, M MB/s).`

use std::time::Instant;

pub struct Progress {
    start: Instant,
    interval: u64,
    docs: u64,
    bytes: u64,
}

impl Progress {
    pub fn new(interval: u64) -> Progress {
        Progress { start: Instant::now(), interval, docs: 0, bytes: 0 }
    }

    /// Counts one document of `bytes` input bytes; prints every `interval` documents.
    pub fn document(&mut self, bytes: u64) {
        self.docs += 1;
        self.bytes += bytes;
        if self.docs.is_multiple_of(self.interval) {
            eprintln!("{}", self.line());
        }
    }

    /// Counts input bytes that produced no document (skipped lines).
    pub fn skipped_bytes(&mut self, bytes: u64) {
        self.bytes += bytes;
    }

    pub fn seconds(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    pub fn documents(&self) -> u64 {
        self.docs
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// `Processed N documents (D docs/s, M MB/s).` (MB = 2^20 bytes, as in Megatron).
    pub fn line(&self) -> String {
        let secs = self.seconds().max(1e-9);
        format!(
            "Processed {} documents ({:.1} docs/s, {:.2} MB/s).",
            self.docs,
            self.docs as f64 / secs,
            self.bytes as f64 / secs / (1024.0 * 1024.0)
        )
    }
}

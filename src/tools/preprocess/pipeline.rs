//! The streaming preprocessing pipeline: one reader thread cuts the input into chunks of
//! records, `--workers` threads encode chunks, and the calling thread writes the encoded
//! documents to the dataset builders in input order.
//!
//! Memory stays bounded because the reader must take a *slot* before it reads a chunk and the
//! writer returns the slot only once that chunk is written: at most `IN_FLIGHT` chunks (of at
//! most `CHUNK_RECORDS` records / `CHUNK_BYTES` bytes) exist at any time, whichever thread
//! is slow, including in the writer's reorder buffer. Every channel can hold all in-flight
//! chunks, so no send ever blocks, and when the writer stops on an error, dropping its slot
//! sender stops the reader, which stops the workers.

use super::encode::{BadLine, Encoder, KeyDocument};
use super::input::{Record, RecordReader};
use super::progress::Progress;
use anyhow::{anyhow, bail, Context, Result};
use clap::ValueEnum;
use megatron_datasets::IndexedDatasetBuilder;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Mutex;

/// Records per chunk (a chunk is the unit of work of one worker).
const CHUNK_RECORDS: usize = 256;
/// Input bytes per chunk, so that long documents make small chunks.
const CHUNK_BYTES: u64 = 512 * 1024;
/// How many line numbers of skipped lines the summary lists.
pub const LISTED_BAD_LINES: usize = 5;

/// `--on-bad-line`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum OnBadLine {
    /// Stop at the first bad line with an error naming it (Megatron's behaviour).
    Fail,
    /// Skip bad lines; their number and the first few are reported at the end.
    Skip,
}

/// What the pipeline did.
#[derive(Debug, Default)]
pub struct PipelineOutcome {
    pub documents: u64,
    pub input_bytes: u64,
    pub seconds: f64,
    pub skipped_lines: u64,
    /// `(line, reason)` of the first [`LISTED_BAD_LINES`] skipped lines.
    pub first_skipped: Vec<(u64, String)>,
    /// Blank lines dropped by the `text-lines` format.
    pub blank_lines: u64,
}

struct Chunk {
    index: u64,
    records: Vec<Record>,
}

struct EncodedChunk {
    index: u64,
    /// `(input bytes, documents per key)` for each record.
    docs: Vec<(u64, Result<Vec<KeyDocument>, BadLine>)>,
}

/// Streams `reader` through one encoding thread per encoder into `builders` (one per key).
pub fn run(
    reader: RecordReader,
    input_path: &Path,
    encoders: &[Encoder],
    on_bad_line: OnBadLine,
    log_interval: u64,
    builders: &mut [IndexedDatasetBuilder],
) -> Result<PipelineOutcome> {
    if encoders.is_empty() {
        bail!("internal error: the pipeline needs at least one encoder");
    }
    let in_flight = 2 * encoders.len() + 2;
    let (slot_tx, slot_rx) = sync_channel::<()>(in_flight);
    for _ in 0..in_flight {
        slot_tx.send(()).map_err(|_| anyhow!("internal error: the slot channel closed early"))?;
    }
    let (chunk_tx, chunk_rx) = sync_channel::<Chunk>(in_flight);
    let (done_tx, done_rx) = sync_channel::<EncodedChunk>(in_flight);
    let chunk_rx = Mutex::new(chunk_rx);
    std::thread::scope(|scope| {
        let reader_thread = scope.spawn(move || read_chunks(reader, chunk_tx, slot_rx));
        for encoder in encoders {
            let (done_tx, chunk_rx) = (done_tx.clone(), &chunk_rx);
            scope.spawn(move || encode_chunks(encoder, chunk_rx, done_tx));
        }
        drop(done_tx);
        let mut progress = Progress::new(log_interval);
        let written = write_in_order(done_rx, slot_tx, builders, on_bad_line, input_path, &mut progress);
        let read = reader_thread.join().map_err(|_| anyhow!("the input reader thread panicked"))?;
        // A read error is the root cause when both failed (the writer then saw a short input).
        let blank_lines = read?;
        let (skipped_lines, first_skipped) = written?;
        Ok(PipelineOutcome {
            documents: progress.documents(),
            input_bytes: progress.bytes(),
            seconds: progress.seconds(),
            skipped_lines,
            first_skipped,
            blank_lines,
        })
    })
}

/// Reader thread: chunks of records, each after taking a slot. Returns the blank-line count.
fn read_chunks(mut reader: RecordReader, chunk_tx: SyncSender<Chunk>, slot_rx: Receiver<()>) -> Result<u64> {
    let mut index = 0;
    loop {
        if slot_rx.recv().is_err() {
            return Ok(reader.blank_lines); // the writer stopped
        }
        let (mut records, mut bytes, mut eof) = (Vec::new(), 0, false);
        while records.len() < CHUNK_RECORDS && bytes < CHUNK_BYTES {
            match reader.next_record()? {
                Some(r) => {
                    bytes += r.bytes;
                    records.push(r);
                }
                None => {
                    eof = true;
                    break;
                }
            }
        }
        if !records.is_empty() {
            if chunk_tx.send(Chunk { index, records }).is_err() {
                return Ok(reader.blank_lines);
            }
            index += 1;
        }
        if eof {
            return Ok(reader.blank_lines);
        }
    }
}

/// Worker thread: encodes chunks until the reader is done or the writer stopped.
fn encode_chunks(encoder: &Encoder, chunk_rx: &Mutex<Receiver<Chunk>>, done_tx: SyncSender<EncodedChunk>) {
    loop {
        let chunk = match chunk_rx.lock() {
            Ok(rx) => match rx.recv() {
                Ok(c) => c,
                Err(_) => return,
            },
            Err(_) => return, // another worker panicked; the scope reports it
        };
        let docs = chunk.records.iter().map(|r| (r.bytes, encoder.encode(r))).collect();
        if done_tx.send(EncodedChunk { index: chunk.index, docs }).is_err() {
            return;
        }
    }
}

type SkipReport = (u64, Vec<(u64, String)>);

/// The calling thread: reorders encoded chunks and appends their documents to the builders.
fn write_in_order(
    done_rx: Receiver<EncodedChunk>,
    slot_tx: SyncSender<()>,
    builders: &mut [IndexedDatasetBuilder],
    on_bad_line: OnBadLine,
    input_path: &Path,
    progress: &mut Progress,
) -> Result<SkipReport> {
    let mut pending = BTreeMap::new();
    let mut next = 0u64;
    let (mut skipped, mut first_skipped) = (0u64, Vec::new());
    for chunk in done_rx {
        pending.insert(chunk.index, chunk);
        while let Some(chunk) = pending.remove(&next) {
            next += 1;
            for (bytes, doc) in chunk.docs {
                match doc {
                    Ok(keys) => {
                        for (builder, d) in builders.iter_mut().zip(&keys) {
                            builder.add_document(&d.tokens, &d.lengths).context("writing the output dataset")?;
                        }
                        progress.document(bytes);
                    }
                    Err(bad) if on_bad_line == OnBadLine::Skip => {
                        skipped += 1;
                        if first_skipped.len() < LISTED_BAD_LINES {
                            first_skipped.push((bad.line, bad.reason));
                        }
                        progress.skipped_bytes(bytes);
                    }
                    Err(bad) => bail!(
                        "`{}` line {}: {}; fix or remove the line, or pass --on-bad-line skip",
                        input_path.display(),
                        bad.line,
                        bad.reason
                    ),
                }
            }
            // The chunk is written: the reader may read another one.
            let _ = slot_tx.send(());
        }
    }
    if !pending.is_empty() {
        bail!("internal error: {} encoded chunks were never written (a worker stopped early)", pending.len());
    }
    Ok((skipped, first_skipped))
}

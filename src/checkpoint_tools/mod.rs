//! `megatron checkpoint convert | inspect`: thin commands over the Megatron-LM checkpoint crate
//! (`megatron-checkpoint-megatron`) and the native one, plus the format detection `pretrain
//! --load` uses ([`resolve_load_dir`]).

pub mod convert;
pub mod inspect;

use anyhow::Result;
use clap::Subcommand;
use megatron_core::Registry;
use std::path::{Path, PathBuf};

/// `megatron checkpoint <command>`.
#[derive(Subcommand, Debug)]
pub enum CheckpointCommand {
    /// Convert a checkpoint (Megatron-LM legacy torch or megatron-rs native) to another format
    /// or parallel layout.
    Convert(convert::ConvertArgs),
    /// Print a checkpoint's format, iteration, args and every tensor (shape, dtype, norm).
    Inspect(inspect::InspectArgs),
}

pub fn run(cmd: &CheckpointCommand, registry: &Registry) -> Result<()> {
    match cmd {
        CheckpointCommand::Convert(a) => convert::run(a, registry),
        CheckpointCommand::Inspect(a) => inspect::run(a),
    }
}

/// The checkpoint formats a directory may hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Native,
    MegatronLegacy,
    TorchDist,
}

/// Which format `dir` holds (by its files), if any.
pub fn detect(dir: &Path) -> Option<Format> {
    use megatron_checkpoint_megatron::layout;
    if layout::is_legacy(dir) {
        Some(Format::MegatronLegacy)
    } else if layout::is_torch_dist(dir) {
        Some(Format::TorchDist)
    } else if megatron_checkpoint::read_tracker(dir).ok().flatten().is_some() {
        Some(Format::Native)
    } else {
        None
    }
}

/// A temporary native copy of a converted checkpoint, removed when dropped.
pub struct TempCheckpoint(pub PathBuf);

impl Drop for TempCheckpoint {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A fresh temporary directory for an on-the-fly conversion: unique per process, rank and call
/// (several runs in one process — tests, ranks as threads — must not share one).
fn import_dir(rank: usize) -> PathBuf {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    std::env::temp_dir().join(format!("megatron-rs-import-{}-{rank}-{n}", std::process::id()))
}

/// For `pretrain --load DIR`: a Megatron-LM legacy checkpoint is converted to a temporary
/// native one (vocabulary padded to `padded_vocab` rows) and that is loaded instead; a
/// native directory (or none) is returned as is.
pub fn resolve_load_dir(dir: &Path, padded_vocab: Option<usize>, rank: usize) -> Result<Option<TempCheckpoint>> {
    match detect(dir) {
        Some(Format::MegatronLegacy) => {
            let tmp = import_dir(rank);
            let _ = std::fs::remove_dir_all(&tmp);
            let guard = TempCheckpoint(tmp.clone());
            let ck = megatron_checkpoint_megatron::legacy::open(dir, None)?;
            if rank == 0 {
                println!(
                    " loading Megatron-LM legacy checkpoint {} (iteration {}, tp{} x pp{}) by converting it",
                    dir.display(),
                    ck.iteration(),
                    ck.shape.tp,
                    ck.shape.pp
                );
            }
            convert::legacy_to_native(&ck, &tmp, padded_vocab, false)?;
            Ok(Some(guard))
        }
        Some(Format::TorchDist) => {
            let tmp = import_dir(rank);
            let _ = std::fs::remove_dir_all(&tmp);
            let guard = TempCheckpoint(tmp.clone());
            let ck = megatron_checkpoint_megatron::dist::open(dir, None)?;
            if rank == 0 {
                println!(
                    " loading Megatron-Core torch_dist checkpoint {} (iteration {}) by converting it (model weights \
                     and run state; its optimizer state is not read: use --no-load-optim)",
                    dir.display(),
                    ck.iteration()
                );
            }
            convert::dist_to_native(&ck, &tmp, padded_vocab, false)?;
            Ok(Some(guard))
        }
        _ => Ok(None),
    }
}

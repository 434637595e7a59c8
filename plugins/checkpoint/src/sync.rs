//! The two collectives saving needs, over the world group: agreeing on success, and
//! all-gathering each rank's (JSON) tensor index. A world of one rank skips the communicator,
//! so single-rank saves work with any backend.

use anyhow::{bail, Result};
use megatron_core::{Backend, DType, HostBuffer, ParallelContext, ReduceOp};

/// Every rank learns whether all ranks succeeded at `what`; a rank that failed returns its own
/// error, the others an error pointing at it. Also a barrier.
pub(crate) fn agree(ctx: &ParallelContext, local: Result<()>, what: &str) -> Result<()> {
    if ctx.world_size() == 1 {
        return local;
    }
    let mut failed = [if local.is_err() { 1.0 } else { 0.0 }];
    ctx.comm.all_reduce_f64(&ctx.world_group, &mut failed, ReduceOp::Max)?;
    local?;
    if failed[0] > 0.0 {
        bail!("another rank failed while {what} (see its error); this checkpoint was not committed");
    }
    Ok(())
}

/// Each rank's `local` bytes, indexed by global rank. Shorter payloads are padded with
/// spaces (JSON whitespace) to the longest, since `all_gather` needs equal sizes.
pub(crate) fn all_gather_bytes(ctx: &ParallelContext, backend: &dyn Backend, local: Vec<u8>) -> Result<Vec<Vec<u8>>> {
    let world = ctx.world_group.size();
    if world == 1 {
        return Ok(vec![local]);
    }
    let mut len = [local.len() as f64];
    ctx.comm.all_reduce_f64(&ctx.world_group, &mut len, ReduceOp::Max)?;
    let max = (len[0] as usize).max(1);
    let mut padded = local;
    padded.resize(max, b' ');
    let input = backend.from_host(HostBuffer::U8(padded), &[max])?;
    let mut output = backend.zeros(&[world * max], DType::U8)?;
    ctx.comm.all_gather(&ctx.world_group, &input, &mut output)?;
    match backend.to_host(&output)? {
        HostBuffer::U8(all) => Ok(all.chunks(max).map(<[u8]>::to_vec).collect()),
        other => bail!("all_gather of uint8 checkpoint indices returned {} data", other.dtype()),
    }
}

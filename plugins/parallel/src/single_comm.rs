//! The `single` communicator plugin: the core's [`SingleRankCommunicator`] for a world of one.

use anyhow::{bail, Result};
use megatron_core::{Communicator, SingleRankCommunicator};
use std::sync::Arc;

/// One endpoint for `world_size == 1`; any larger world is an error saying what to use.
pub fn single_communicators(world_size: usize) -> Result<Vec<Arc<dyn Communicator>>> {
    if world_size != 1 {
        bail!(
            "the `single` communicator runs exactly one rank, but {world_size} ranks were requested (--nproc / \
             tensor x pipeline x data parallel sizes); multi-rank runs need the `local` (threads) communicator, \
             which comes with the issue \"Tensor, pipeline and data parallelism\""
        );
    }
    Ok(vec![Arc::new(SingleRankCommunicator)])
}

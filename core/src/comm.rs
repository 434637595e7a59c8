//! The [`Communicator`] trait (collectives over groups of ranks) and the trivial
//! single-rank communicator used when the world size is 1.

use crate::{DeviceTensor, Result};
use anyhow::bail;
use serde::{Deserialize, Serialize};

/// A named group of global ranks (TP, PP, DP, ...). `ranks` is sorted ascending.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Group {
    pub name: String,
    pub ranks: Vec<usize>,
}

impl Group {
    pub fn new(name: impl Into<String>, ranks: Vec<usize>) -> Group {
        Group { name: name.into(), ranks }
    }

    pub fn size(&self) -> usize {
        self.ranks.len()
    }

    /// Position of global rank `rank` inside the group.
    pub fn index_of(&self, rank: usize) -> Option<usize> {
        self.ranks.iter().position(|&r| r == rank)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReduceOp {
    Sum,
    Max,
}

/// Collectives on [`Group`]s. Every call on a group carries that group's sequence number so a
/// hang can name the group, the call and the ranks that never arrived.
pub trait Communicator: Send + Sync {
    fn name(&self) -> &str;
    fn world_size(&self) -> usize;
    /// This endpoint's global rank.
    fn rank(&self) -> usize;
    fn all_reduce(&self, group: &Group, t: &mut DeviceTensor, op: ReduceOp) -> Result<()>;
    /// Host scalars (loss sums, squared norms) reduced in f64.
    fn all_reduce_f64(&self, group: &Group, values: &mut [f64], op: ReduceOp) -> Result<()>;
    /// `output` = the group's inputs concatenated along dim 0, in group order.
    fn all_gather(&self, group: &Group, input: &DeviceTensor, output: &mut DeviceTensor) -> Result<()>;
    /// `output` = this rank's dim-0 slice of the reduction of all inputs.
    fn reduce_scatter(
        &self,
        group: &Group,
        input: &DeviceTensor,
        output: &mut DeviceTensor,
        op: ReduceOp,
    ) -> Result<()>;
    /// `root` is a global rank.
    fn broadcast(&self, group: &Group, t: &mut DeviceTensor, root: usize) -> Result<()>;
    /// Point to point: `dst` is a global rank of `group`. Implementations may buffer (the
    /// `local` communicator returns at once), so a send never waits for the matching recv.
    fn send(&self, group: &Group, t: &DeviceTensor, dst: usize) -> Result<()>;
    /// Receives the next tensor `src` (a global rank of `group`) sent to this rank on `group`;
    /// its shape and dtype must match `t`.
    fn recv(&self, group: &Group, t: &mut DeviceTensor, src: usize) -> Result<()>;
    fn barrier(&self, group: &Group) -> Result<()>;
    /// All-to-all with variable splits (MoE token dispatch): this rank sends rows
    /// `[Σ send_splits[..j], Σ send_splits[..=j])` of `input` (dim 0) to the j-th rank of
    /// `group`, and `output` receives, in group order, `recv_splits[i]` rows from the i-th
    /// rank. Rows are `numel / shape[0]` elements; both tensors must have the same row size
    /// and dtype. The splits must agree pairwise (`send_splits[j]` here = `recv_splits[me]`
    /// on rank j). The default is an error: communicators that can, override it.
    fn all_to_all(
        &self,
        group: &Group,
        input: &DeviceTensor,
        send_splits: &[usize],
        output: &mut DeviceTensor,
        recv_splits: &[usize],
    ) -> Result<()> {
        let _ = (input, send_splits, output, recv_splits);
        bail!(
            "the `{}` communicator does not implement all_to_all (group `{}`), which expert parallelism \
             needs; use the `local` communicator (--nproc N, ranks as threads) or --expert-model-parallel-size 1",
            self.name(),
            group.name
        )
    }
    /// Fails every pending and future call of every rank of this world with `reason` (a rank
    /// that errored or panicked calls it so its peers stop waiting instead of timing out).
    /// A no-op where there is nothing to release.
    fn abort(&self, _reason: &str) {}
}

/// The communicator of a world of one rank: every collective is the identity.
#[derive(Debug, Default)]
pub struct SingleRankCommunicator;

impl SingleRankCommunicator {
    fn check(&self, group: &Group) -> Result<()> {
        if group.ranks != [0] {
            bail!(
                "group `{}` has ranks {:?}, but the single-rank communicator only has rank 0; \
                 run with a multi-rank communicator (--nproc) for parallel groups",
                group.name,
                group.ranks
            );
        }
        Ok(())
    }
}

impl Communicator for SingleRankCommunicator {
    fn name(&self) -> &str {
        "single"
    }
    fn world_size(&self) -> usize {
        1
    }
    fn rank(&self) -> usize {
        0
    }
    fn all_reduce(&self, group: &Group, _t: &mut DeviceTensor, _op: ReduceOp) -> Result<()> {
        self.check(group)
    }
    fn all_reduce_f64(&self, group: &Group, _values: &mut [f64], _op: ReduceOp) -> Result<()> {
        self.check(group)
    }
    fn all_gather(&self, group: &Group, input: &DeviceTensor, output: &mut DeviceTensor) -> Result<()> {
        self.check(group)?;
        copy_same(input, output)
    }
    fn reduce_scatter(
        &self,
        group: &Group,
        input: &DeviceTensor,
        output: &mut DeviceTensor,
        _op: ReduceOp,
    ) -> Result<()> {
        self.check(group)?;
        copy_same(input, output)
    }
    fn broadcast(&self, group: &Group, _t: &mut DeviceTensor, _root: usize) -> Result<()> {
        self.check(group)
    }
    fn send(&self, group: &Group, _t: &DeviceTensor, dst: usize) -> Result<()> {
        bail!("send to rank {dst} in group `{}`: a single-rank world has no peer", group.name)
    }
    fn recv(&self, group: &Group, _t: &mut DeviceTensor, src: usize) -> Result<()> {
        bail!("recv from rank {src} in group `{}`: a single-rank world has no peer", group.name)
    }
    fn barrier(&self, group: &Group) -> Result<()> {
        self.check(group)
    }
    fn all_to_all(
        &self,
        group: &Group,
        input: &DeviceTensor,
        send_splits: &[usize],
        output: &mut DeviceTensor,
        recv_splits: &[usize],
    ) -> Result<()> {
        self.check(group)?;
        if send_splits != recv_splits || send_splits.len() != 1 {
            bail!("all_to_all on one rank: send splits {send_splits:?} and recv splits {recv_splits:?} must both be one equal count");
        }
        copy_same(input, output)
    }
}

fn copy_same(input: &DeviceTensor, output: &mut DeviceTensor) -> Result<()> {
    if input.shape() != output.shape() || input.dtype() != output.dtype() {
        bail!(
            "collective output {:?} {} does not match input {:?} {}",
            output.shape(),
            output.dtype(),
            input.shape(),
            input.dtype()
        );
    }
    let src = input.host_buffer()?.clone();
    *output.host_buffer_mut()? = src;
    Ok(())
}

//! `all_to_all` with variable splits (MPI_Alltoallv's semantics) for the expert-parallel token
//! dispatcher: one exchange step in which member k receives its rows straight from every other
//! member, with the header, the group's sequence number and the timeout of every other
//! collective here. Not `MPI_Alltoallv` itself: like MPI's other blocking collectives it never
//! times out and cannot name a missing rank (see `world.rs`), and it would need a
//! sub-communicator per group (no `MPI_Comm_split` moment, see `world.rs`).
//!
//! A member still sends a (header-only) message when it has no rows for a peer, so a rank that
//! skipped the call is named after the timeout whatever the splits were. Splits that disagree
//! between a sender and a receiver are an error naming both ranks and the splits, never a
//! silently shifted output.

use super::{store, MpiCommunicator};
use crate::world::{group_label, TimedOut};
use anyhow::{bail, Result};
use megatron_comm_local::payload::{Kind, OpDesc, Payload};
use megatron_core::{DeviceTensor, Group, HostBuffer};

impl MpiCommunicator {
    /// The trait's `all_to_all`: rows `[Σ send_splits[..j], Σ send_splits[..=j])` of `input`
    /// go to member j; `output` gets `recv_splits[i]` rows from member i, in group order.
    pub(super) fn all_to_all_v(
        &self,
        group: &Group,
        input: &DeviceTensor,
        send_splits: &[usize],
        output: &mut DeviceTensor,
        recv_splits: &[usize],
    ) -> Result<()> {
        let rank = self.engine.rank;
        let buf = self.host(input, "all_to_all")?;
        let n = group.size();
        let row = |t: &DeviceTensor| t.shape().iter().skip(1).product::<usize>();
        let (rows_in, rows_out): (usize, usize) = (send_splits.iter().sum(), recv_splits.iter().sum());
        if send_splits.len() != n
            || recv_splits.len() != n
            || input.shape().first() != Some(&rows_in)
            || output.shape().first() != Some(&rows_out)
            || row(input) != row(output)
            || input.dtype() != output.dtype()
        {
            bail!(
                "all_to_all on group `{}` (rank {rank}): input {:?} {} with send splits {send_splits:?} and output {:?} \
                 {} with recv splits {recv_splits:?} must have one split per member ({n}), splits that add up to dim \
                 0, and equal row sizes and dtypes",
                group.name,
                input.shape(),
                input.dtype(),
                output.shape(),
                output.dtype()
            );
        }
        let dtype = buf.dtype();
        // Same description as the `local` communicator: `len` is the group size.
        let desc = OpDesc { kind: Kind::AllToAll, op: None, dtype: Some(dtype), len: n, root: None };
        let c = self.start(group, desc)?;
        if send_splits[c.idx] != recv_splits[c.idx] {
            bail!(
                "all_to_all on group {} (rank {rank}): this rank sends itself {} rows but expects {} from itself \
                 (send_splits[{i}] must equal recv_splits[{i}])",
                group_label(group),
                send_splits[c.idx],
                recv_splits[c.idx],
                i = c.idx
            );
        }
        let row_bytes = row(input) * dtype.size();
        let bytes = buf.to_le_bytes();
        // (rows_in, row) cut by send_splits: member k's rows, this rank's own part kept aside.
        let mut out = Vec::with_capacity(n);
        let mut own: &[u8] = &[];
        let mut off = 0;
        for (k, &s) in send_splits.iter().enumerate() {
            let part = &bytes[off..off + s * row_bytes];
            off += s * row_bytes;
            if k == c.idx {
                own = part;
                out.push(None);
            } else {
                out.push(Some(part.to_vec()));
            }
        }
        let ins: Vec<Option<usize>> = (0..n).map(|k| (k != c.idx).then_some(recv_splits[k] * row_bytes)).collect();
        let got = self.step(&c, 0, out, &ins).map_err(|e| {
            if e.is::<TimedOut>() {
                // The hang diagnosis stays word for word the threads communicator's.
                return e;
            }
            e.context(format!(
                "all_to_all on group {} (rank {rank}) with send splits {send_splits:?} and recv splits \
                 {recv_splits:?}: every peer's send split for this rank must equal this rank's recv split for it",
                group_label(group)
            ))
        })?;
        // (rows_out, row): the parts in group order.
        let mut all = Vec::with_capacity(rows_out * row_bytes);
        for (k, g) in got.into_iter().enumerate() {
            match g {
                Some(part) => all.extend_from_slice(&part),
                None if k == c.idx => all.extend_from_slice(own),
                None => bail!("internal error: no all_to_all part from member {k}"),
            }
        }
        store(output, Payload::Tensor(HostBuffer::from_le_bytes(dtype, &all)?), "all_to_all")
    }
}

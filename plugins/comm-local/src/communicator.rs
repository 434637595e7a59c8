//! [`LocalCommunicator`]: one endpoint (rank) of a world of threads. It copies tensors out of
//! and into host memory and leaves the waiting and the arithmetic to [`World`].

use crate::payload::{Kind, OpDesc, Payload};
use crate::world::World;
use anyhow::{bail, Context, Result};
use megatron_core::{Communicator, DeviceTensor, Group, HostBuffer, ReduceOp};
use std::sync::Arc;
use std::time::Duration;

/// One rank of a world whose ranks are threads of this process.
pub struct LocalCommunicator {
    rank: usize,
    world: Arc<World>,
}

impl LocalCommunicator {
    /// The endpoints of a new world of `n` ranks (index = global rank); a rank waiting longer
    /// than `timeout` for its peers fails, and so does every other rank of the world.
    pub fn world(n: usize, timeout: Duration) -> Vec<Arc<dyn Communicator>> {
        let world = Arc::new(World::new(n, timeout));
        (0..n).map(|rank| Arc::new(LocalCommunicator { rank, world: world.clone() }) as Arc<dyn Communicator>).collect()
    }

    fn host<'a>(&self, t: &'a DeviceTensor, what: &str) -> Result<&'a HostBuffer> {
        t.host_buffer().with_context(|| {
            format!(
                "{what} on rank {}: the `local` communicator moves host memory only; use a host backend (cpu) \
                 for multi-rank runs",
                self.rank
            )
        })
    }

    fn tensor_desc(kind: Kind, op: Option<ReduceOp>, t: &HostBuffer, root: Option<usize>) -> OpDesc {
        OpDesc { kind, op, dtype: Some(t.dtype()), len: t.len(), root }
    }

    /// Writes `out` into `t` (same dtype and element count by construction).
    fn store(&self, t: &mut DeviceTensor, out: Payload, what: &str) -> Result<()> {
        let Payload::Tensor(buf) = out else { bail!("internal error: {what} returned no tensor") };
        let dst = t.host_buffer_mut()?;
        if dst.len() != buf.len() || dst.dtype() != buf.dtype() {
            bail!(
                "{what} on rank {}: result of {} {} elements does not fit the output tensor of {} {} elements",
                self.rank,
                buf.dtype(),
                buf.len(),
                dst.dtype(),
                dst.len()
            );
        }
        *dst = buf;
        Ok(())
    }
}

impl Communicator for LocalCommunicator {
    fn name(&self) -> &str {
        "local"
    }

    fn world_size(&self) -> usize {
        self.world.size
    }

    fn rank(&self) -> usize {
        self.rank
    }

    fn all_reduce(&self, group: &Group, t: &mut DeviceTensor, op: ReduceOp) -> Result<()> {
        let input = self.host(t, "all_reduce")?.clone();
        let desc = Self::tensor_desc(Kind::AllReduce, Some(op), &input, None);
        let out = self.world.collective(group, self.rank, desc, Payload::Tensor(input), None)?;
        self.store(t, out, "all_reduce")
    }

    fn all_reduce_f64(&self, group: &Group, values: &mut [f64], op: ReduceOp) -> Result<()> {
        let desc = OpDesc { kind: Kind::AllReduceF64, op: Some(op), dtype: None, len: values.len(), root: None };
        match self.world.collective(group, self.rank, desc, Payload::F64(values.to_vec()), None)? {
            Payload::F64(v) => values.copy_from_slice(&v),
            other => bail!("internal error: all_reduce_f64 returned {other:?}"),
        }
        Ok(())
    }

    fn all_gather(&self, group: &Group, input: &DeviceTensor, output: &mut DeviceTensor) -> Result<()> {
        let buf = self.host(input, "all_gather")?.clone();
        let want = buf.len() * group.size();
        if output.numel() != want || output.dtype() != buf.dtype() {
            bail!(
                "all_gather on group `{}` (rank {}): output {:?} {} must hold {} x {} {} elements",
                group.name,
                self.rank,
                output.shape(),
                output.dtype(),
                group.size(),
                buf.len(),
                buf.dtype()
            );
        }
        let desc = Self::tensor_desc(Kind::AllGather, None, &buf, None);
        let out = self.world.collective(group, self.rank, desc, Payload::Tensor(buf), None)?;
        self.store(output, out, "all_gather")
    }

    fn reduce_scatter(
        &self,
        group: &Group,
        input: &DeviceTensor,
        output: &mut DeviceTensor,
        op: ReduceOp,
    ) -> Result<()> {
        let buf = self.host(input, "reduce_scatter")?.clone();
        let n = group.size();
        if !buf.len().is_multiple_of(n) || output.numel() * n != buf.len() || output.dtype() != buf.dtype() {
            bail!(
                "reduce_scatter on group `{}` (rank {}): input {:?} {} must split into {n} equal parts the size \
                 of the output {:?} {}",
                group.name,
                self.rank,
                input.shape(),
                input.dtype(),
                output.shape(),
                output.dtype()
            );
        }
        let desc = Self::tensor_desc(Kind::ReduceScatter, Some(op), &buf, None);
        let out = self.world.collective(group, self.rank, desc, Payload::Tensor(buf), None)?;
        self.store(output, out, "reduce_scatter")
    }

    fn broadcast(&self, group: &Group, t: &mut DeviceTensor, root: usize) -> Result<()> {
        let buf = self.host(t, "broadcast")?;
        // Only the root's data matters; the others send an empty placeholder of the same kind.
        let input = if root == self.rank { buf.clone() } else { HostBuffer::zeros(buf.dtype(), 0) };
        let desc =
            OpDesc { kind: Kind::Broadcast, op: None, dtype: Some(buf.dtype()), len: buf.len(), root: Some(root) };
        let out = self.world.collective(group, self.rank, desc, Payload::Tensor(input), Some(root))?;
        self.store(t, out, "broadcast")
    }

    fn send(&self, group: &Group, t: &DeviceTensor, dst: usize) -> Result<()> {
        let buf = self.host(t, "send")?.clone();
        self.world.send(group, self.rank, dst, t.shape(), Payload::Tensor(buf))
    }

    fn recv(&self, group: &Group, t: &mut DeviceTensor, src: usize) -> Result<()> {
        let want = Payload::Tensor(HostBuffer::zeros(self.host(t, "recv")?.dtype(), 0));
        let shape = t.shape().to_vec();
        let out = self.world.recv(group, self.rank, src, &shape, &want)?;
        self.store(t, out, "recv")
    }

    fn barrier(&self, group: &Group) -> Result<()> {
        let desc = OpDesc { kind: Kind::Barrier, op: None, dtype: None, len: 0, root: None };
        self.world.collective(group, self.rank, desc, Payload::Empty, None).map(|_| ())
    }

    fn all_to_all(
        &self,
        group: &Group,
        input: &DeviceTensor,
        send_splits: &[usize],
        output: &mut DeviceTensor,
        recv_splits: &[usize],
    ) -> Result<()> {
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
                "all_to_all on group `{}` (rank {}): input {:?} {} with send splits {send_splits:?} and output {:?} {} \
                 with recv splits {recv_splits:?} must have one split per member ({n}), splits that add up to dim 0, \
                 and equal row sizes and dtypes",
                group.name,
                self.rank,
                input.shape(),
                input.dtype(),
                output.shape(),
                output.dtype()
            );
        }
        let counts: Vec<usize> = send_splits.iter().map(|s| s * row(input)).collect();
        let parts = crate::payload::split_counts(buf, &counts)?;
        let desc = OpDesc { kind: Kind::AllToAll, op: None, dtype: Some(buf.dtype()), len: n, root: None };
        let out = self.world.collective(group, self.rank, desc, Payload::Parts(parts), None)?;
        let got = out.len();
        if got != output.numel() {
            bail!(
                "all_to_all on group `{}` (rank {}): received {got} elements but recv splits {recv_splits:?} expect {}; \
                 the peers' send splits disagree with this rank's recv splits",
                group.name,
                self.rank,
                output.numel()
            );
        }
        self.store(output, out, "all_to_all")
    }

    fn abort(&self, reason: &str) {
        self.world.poison(format!("rank {} aborted the world: {reason}", self.rank));
    }
}

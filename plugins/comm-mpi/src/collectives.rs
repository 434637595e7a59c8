//! [`MpiCommunicator`]: the `Communicator` trait over [`Engine`] exchanges.
//!
//! Algorithms (n = group size, S = bytes per rank):
//! * all_reduce: small tensors (n·S ≤ 256 KiB) all-gather everything and reduce locally; larger
//!   ones reduce-scatter then all-gather by direct exchange (each rank receives the n-1 pieces
//!   of its 1/n share, reduces them in rank order, and sends the result to everybody), moving
//!   2·(n-1)/n·S per rank like a ring, in two latency steps instead of 2·(n-1);
//! * reduce_scatter: the first half of that; all_gather / barrier: everybody sends to
//!   everybody; broadcast: the root sends to the others; send/recv: one buffered message;
//!   all_to_all (variable splits, `alltoall.rs`): one exchange, member k's rows straight to k.
//!
//! Every reduction runs `megatron_comm_local::payload::reduce` over the pieces in rank order,
//! so every rank and every run gets the bits an `--nproc` threads run gets.

use crate::ffi::{self, Comm};
use crate::world::{group_hash, group_label, Engine, Header, Stream, FIXED_WORDS};
use anyhow::{anyhow, bail, Context, Result};
use megatron_comm_local::payload::{concat, reduce, Kind, OpDesc, Payload};
use megatron_core::{Communicator, DType, DeviceTensor, Group, HostBuffer, ReduceOp};
use std::time::Duration;

mod alltoall;

const P2P_KIND: u64 = 100;
/// Below this many bytes gathered per rank, all_reduce gathers everything in one step.
const SMALL_ALL_REDUCE: usize = 256 << 10;

fn kind_code(k: Kind) -> u64 {
    match k {
        Kind::AllReduce => 1,
        Kind::AllReduceF64 => 2,
        Kind::AllGather => 3,
        Kind::ReduceScatter => 4,
        Kind::Broadcast => 5,
        Kind::Barrier => 6,
        Kind::AllToAll => 7,
    }
}

fn kind_of(code: u64) -> Option<Kind> {
    Some(match code {
        1 => Kind::AllReduce,
        2 => Kind::AllReduceF64,
        3 => Kind::AllGather,
        4 => Kind::ReduceScatter,
        5 => Kind::Broadcast,
        6 => Kind::Barrier,
        7 => Kind::AllToAll,
        _ => return None,
    })
}

const DTYPES: [DType; 7] = [DType::F32, DType::BF16, DType::F16, DType::I32, DType::I64, DType::U8, DType::U16];

fn dtype_code(d: Option<DType>) -> u64 {
    d.and_then(|d| DTYPES.iter().position(|&x| x == d)).map_or(0, |i| i as u64 + 1)
}

fn op_code(op: Option<ReduceOp>) -> u64 {
    match op {
        None => 0,
        Some(ReduceOp::Sum) => 1,
        Some(ReduceOp::Max) => 2,
    }
}

/// The operation a header describes, for error messages.
fn describe(h: &Header) -> String {
    if h.kind == P2P_KIND {
        let d = DTYPES.get((h.dtype as usize).wrapping_sub(1)).map_or("?".into(), |d| d.to_string());
        return format!("send #{} of shape {:?} ({d})", h.seq, h.shape);
    }
    let Some(kind) = kind_of(h.kind) else { return format!("an unknown operation (code {})", h.kind) };
    let desc = OpDesc {
        kind,
        op: match h.op {
            1 => Some(ReduceOp::Sum),
            2 => Some(ReduceOp::Max),
            _ => None,
        },
        dtype: DTYPES.get((h.dtype as usize).wrapping_sub(1)).copied(),
        len: h.len as usize,
        root: (kind == Kind::Broadcast).then_some(h.root as usize),
    };
    format!("{desc} #{}", h.seq)
}

/// One rank (this process) of an MPI world.
pub struct MpiCommunicator {
    engine: Engine,
    library: String,
}

/// A collective in progress: its group, description and sequence number.
struct Call<'a> {
    group: &'a Group,
    hash: u64,
    desc: OpDesc,
    seq: u64,
    idx: usize,
}

impl MpiCommunicator {
    /// Initialises MPI (once per process) and returns this process's endpoint.
    pub fn init(timeout: Duration) -> Result<MpiCommunicator> {
        if ffi::initialized() {
            bail!(
                "MPI is already initialised in this process: build the `mpi` communicator once per process \
                 (MPI cannot be initialised twice)"
            );
        }
        let level = ffi::init()?;
        if level == ffi::Threading::Less {
            ffi::finalize()?;
            bail!(
                "the MPI library provides less than MPI_THREAD_SERIALIZED; the `mpi` communicator calls MPI from \
                 several threads (serialised): use an MPI built with thread support (Debian's OpenMPI or MPICH)"
            );
        }
        let comm: Comm = ffi::dup_world()?;
        let (rank, size) = ffi::rank_and_size(comm)?;
        Ok(MpiCommunicator { engine: Engine::new(comm, rank, size, timeout), library: ffi::library_version() })
    }

    /// The MPI library's version line (`Open MPI v4.1.4, ...`, `MPICH Version: ...`).
    pub fn library(&self) -> &str {
        &self.library
    }

    fn host<'a>(&self, t: &'a DeviceTensor, what: &str) -> Result<&'a HostBuffer> {
        t.host_buffer().with_context(|| {
            format!(
                "{what} on rank {}: the `mpi` communicator moves host memory only; use a host backend (cpu)",
                self.engine.rank
            )
        })
    }

    fn start<'a>(&self, group: &'a Group, desc: OpDesc) -> Result<Call<'a>> {
        let idx = self.engine.member(group)?;
        if let Some(root) = desc.root {
            if group.index_of(root).is_none() {
                bail!("{desc}: root rank {root} is not a member of group {}", group_label(group));
            }
        }
        let hash = group_hash(group);
        let seq = self.engine.next_seq(hash, Stream::Collective);
        Ok(Call { group, hash, desc, seq, idx })
    }

    fn header(&self, c: &Call, phase: u64) -> Header {
        Header {
            group: c.hash,
            seq: c.seq,
            kind: kind_code(c.desc.kind),
            op: op_code(c.desc.op),
            dtype: dtype_code(c.desc.dtype),
            len: c.desc.len as u64,
            // Broadcast: the root; all_reduce: which of its two steps.
            root: c.desc.root.map_or(phase, |r| r as u64),
            payload_bytes: 0,
            shape: Vec::new(),
        }
    }

    /// One exchange step of collective `c`: sends `out[k]` to member `k` (None: nothing), and
    /// receives `in_bytes[k]` payload bytes from member `k` (None: nothing). Returns the
    /// received payloads by member index.
    fn step(
        &self,
        c: &Call,
        phase: u64,
        out: Vec<Option<Vec<u8>>>,
        in_bytes: &[Option<usize>],
    ) -> Result<Vec<Option<Vec<u8>>>> {
        let hdr = self.header(c, phase);
        let tag = self.engine.tag(c.hash, false);
        let recvs: Vec<(usize, usize)> = in_bytes
            .iter()
            .enumerate()
            .filter_map(|(k, b)| b.map(|b| (c.group.ranks[k], FIXED_WORDS * 8 + b)))
            .collect();
        let sends: Vec<(usize, Vec<u8>)> =
            out.into_iter().enumerate().filter_map(|(k, p)| p.map(|p| (c.group.ranks[k], hdr.frame(&p)))).collect();
        let rank = self.engine.rank;
        let timeout = self.engine.timeout;
        let msgs = self.engine.exchange(tag, &recvs, sends, |missing| {
            format!(
                "collective {} #{} on group {} timed out after {timeout:?} waiting on rank {rank}: ranks {missing:?} \
                 never arrived (they skipped this collective, are stuck, or failed earlier)",
                c.desc,
                c.seq,
                group_label(c.group)
            )
        })?;
        let mut result: Vec<Option<Vec<u8>>> = vec![None; c.group.size()];
        let mut msgs = msgs.into_iter();
        for (k, b) in in_bytes.iter().enumerate() {
            let Some(b) = b else { continue };
            let msg = msgs.next().ok_or_else(|| anyhow!("internal error: a receive went missing"))?;
            let (h, payload) = Header::parse(&msg)?;
            let mut want = hdr.clone();
            want.payload_bytes = *b as u64;
            if h != want && (Header { payload_bytes: want.payload_bytes, ..h.clone() }) == want {
                // Same collective, other size: only all_to_all's splits can disagree like this.
                bail!(
                    "{} #{} on group {}: rank {} sent {} bytes to rank {rank}, which expected {} bytes",
                    c.desc,
                    c.seq,
                    group_label(c.group),
                    c.group.ranks[k],
                    h.payload_bytes,
                    b
                );
            }
            if h != want {
                bail!(
                    "mismatched collectives on group {} at sequence #{}: rank {} called {} but rank {rank} called {} \
                     #{}; every rank of a group must issue the same collectives in the same order",
                    group_label(c.group),
                    c.seq,
                    c.group.ranks[k],
                    describe(&h),
                    c.desc,
                    c.seq
                );
            }
            result[k] = Some(payload.to_vec());
        }
        Ok(result)
    }

    /// Everybody's `mine` (same length), by member index.
    fn gather_all(&self, c: &Call, mine: Vec<u8>) -> Result<Vec<Vec<u8>>> {
        let n = c.group.size();
        let len = mine.len();
        let out = (0..n).map(|k| (k != c.idx).then(|| mine.clone())).collect();
        let ins: Vec<Option<usize>> = (0..n).map(|k| (k != c.idx).then_some(len)).collect();
        let got = self.step(c, 0, out, &ins)?;
        Ok(got
            .into_iter()
            .enumerate()
            .map(|(k, g)| if k == c.idx { mine.clone() } else { g.unwrap_or_default() })
            .collect())
    }

    /// Reduce-scatter step: member `k` gets piece `k` of everybody's `pieces`; returns this
    /// rank's piece reduced over the group in rank order.
    fn scatter_reduce(&self, c: &Call, phase: u64, pieces: Vec<HostBuffer>, op: ReduceOp) -> Result<HostBuffer> {
        let n = c.group.size();
        let mine_len = pieces[c.idx].len() * pieces[c.idx].dtype().size();
        let ins: Vec<Option<usize>> = (0..n).map(|k| (k != c.idx).then_some(mine_len)).collect();
        let mut own = None;
        let mut out = Vec::with_capacity(n);
        for (k, p) in pieces.into_iter().enumerate() {
            if k == c.idx {
                own = Some(p);
                out.push(None);
            } else {
                out.push(Some(p.to_le_bytes()));
            }
        }
        let own = own.ok_or_else(|| anyhow!("internal error: no own piece"))?;
        let dtype = own.dtype();
        let got = self.step(c, phase, out, &ins)?;
        let mut own = Some(own);
        let inputs = got
            .into_iter()
            .map(|g| match g {
                Some(bytes) => HostBuffer::from_le_bytes(dtype, &bytes).map(Payload::Tensor),
                None => Ok(Payload::Tensor(own.take().expect("one own piece"))),
            })
            .collect::<Result<Vec<_>>>()?;
        match reduce(inputs, op)? {
            Payload::Tensor(b) => Ok(b),
            other => bail!("internal error: reduce returned {other:?}"),
        }
    }
}

/// `b` cut into `n` consecutive pieces of `ceil(len/n)` elements (the last ones shorter or empty).
fn pieces(b: &HostBuffer, n: usize) -> Result<Vec<HostBuffer>> {
    let es = b.dtype().size();
    let bytes = b.to_le_bytes();
    let c = b.len().div_ceil(n);
    (0..n)
        .map(|k| {
            let lo = (k * c).min(b.len());
            let hi = ((k + 1) * c).min(b.len());
            HostBuffer::from_le_bytes(b.dtype(), &bytes[lo * es..hi * es])
        })
        .collect()
}

fn to_tensor_payloads(dtype: DType, parts: Vec<Vec<u8>>) -> Result<Vec<Payload>> {
    parts.iter().map(|p| HostBuffer::from_le_bytes(dtype, p).map(Payload::Tensor)).collect()
}

fn store(t: &mut DeviceTensor, out: Payload, what: &str) -> Result<()> {
    let Payload::Tensor(buf) = out else { bail!("internal error: {what} returned no tensor") };
    let dst = t.host_buffer_mut()?;
    if dst.len() != buf.len() || dst.dtype() != buf.dtype() {
        bail!(
            "{what}: a result of {} {} does not fit the output of {} {}",
            buf.len(),
            buf.dtype(),
            dst.len(),
            dst.dtype()
        );
    }
    *dst = buf;
    Ok(())
}

impl Communicator for MpiCommunicator {
    fn name(&self) -> &str {
        "mpi"
    }

    fn world_size(&self) -> usize {
        self.engine.size
    }

    fn rank(&self) -> usize {
        self.engine.rank
    }

    fn all_reduce(&self, group: &Group, t: &mut DeviceTensor, op: ReduceOp) -> Result<()> {
        let input = self.host(t, "all_reduce")?.clone();
        let desc =
            OpDesc { kind: Kind::AllReduce, op: Some(op), dtype: Some(input.dtype()), len: input.len(), root: None };
        let c = self.start(group, desc)?;
        let n = group.size();
        if n == 1 {
            return Ok(());
        }
        let dtype = input.dtype();
        let bytes = input.len() * dtype.size();
        let reduced = if bytes * n <= SMALL_ALL_REDUCE {
            let all = self.gather_all(&c, input.to_le_bytes())?;
            reduce(to_tensor_payloads(dtype, all)?, op)?
        } else {
            let share = self.scatter_reduce(&c, 0, pieces(&input, n)?, op)?;
            let sizes: Vec<usize> = pieces(&input, n)?.iter().map(|p| p.len() * dtype.size()).collect();
            let mine = share.to_le_bytes();
            let out = (0..n).map(|k| (k != c.idx).then(|| mine.clone())).collect();
            let ins: Vec<Option<usize>> = (0..n).map(|k| (k != c.idx).then_some(sizes[k])).collect();
            let got = self.step(&c, 1, out, &ins)?;
            let mut own = Some(mine);
            let parts: Vec<Vec<u8>> =
                got.into_iter().map(|g| g.unwrap_or_else(|| own.take().unwrap_or_default())).collect();
            concat(to_tensor_payloads(dtype, parts)?)?
        };
        store(t, reduced, "all_reduce")
    }

    fn all_reduce_f64(&self, group: &Group, values: &mut [f64], op: ReduceOp) -> Result<()> {
        let desc = OpDesc { kind: Kind::AllReduceF64, op: Some(op), dtype: None, len: values.len(), root: None };
        let c = self.start(group, desc)?;
        if group.size() == 1 {
            return Ok(());
        }
        let mine: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let all = self.gather_all(&c, mine)?;
        let inputs = all
            .iter()
            .map(|b| {
                Payload::F64(b.chunks_exact(8).map(|w| f64::from_le_bytes(w.try_into().expect("8 bytes"))).collect())
            })
            .collect();
        match reduce(inputs, op)? {
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
                self.engine.rank,
                output.shape(),
                output.dtype(),
                group.size(),
                buf.len(),
                buf.dtype()
            );
        }
        let desc = OpDesc { kind: Kind::AllGather, op: None, dtype: Some(buf.dtype()), len: buf.len(), root: None };
        let c = self.start(group, desc)?;
        let all = self.gather_all(&c, buf.to_le_bytes())?;
        store(output, concat(to_tensor_payloads(buf.dtype(), all)?)?, "all_gather")
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
                "reduce_scatter on group `{}` (rank {}): input {:?} {} must split into {n} equal parts the size of \
                 the output {:?} {}",
                group.name,
                self.engine.rank,
                input.shape(),
                input.dtype(),
                output.shape(),
                output.dtype()
            );
        }
        let desc =
            OpDesc { kind: Kind::ReduceScatter, op: Some(op), dtype: Some(buf.dtype()), len: buf.len(), root: None };
        let c = self.start(group, desc)?;
        let share = if n == 1 { buf } else { self.scatter_reduce(&c, 0, pieces(&buf, n)?, op)? };
        store(output, Payload::Tensor(share), "reduce_scatter")
    }

    fn broadcast(&self, group: &Group, t: &mut DeviceTensor, root: usize) -> Result<()> {
        let buf = self.host(t, "broadcast")?;
        let (dtype, len) = (buf.dtype(), buf.len());
        let desc = OpDesc { kind: Kind::Broadcast, op: None, dtype: Some(dtype), len, root: Some(root) };
        let c = self.start(group, desc)?;
        let n = group.size();
        let root_idx = group.index_of(root).expect("checked in start");
        if c.idx == root_idx {
            let bytes = buf.to_le_bytes();
            let out = (0..n).map(|k| (k != c.idx).then(|| bytes.clone())).collect();
            self.step(&c, 0, out, &vec![None; n])?;
            return Ok(());
        }
        let mut ins = vec![None; n];
        ins[root_idx] = Some(len * dtype.size());
        let got = self.step(&c, 0, vec![None; n], &ins)?;
        let bytes =
            got.into_iter().nth(root_idx).flatten().ok_or_else(|| anyhow!("internal error: no broadcast data"))?;
        store(t, Payload::Tensor(HostBuffer::from_le_bytes(dtype, &bytes)?), "broadcast")
    }

    fn send(&self, group: &Group, t: &DeviceTensor, dst: usize) -> Result<()> {
        self.engine.member(group)?;
        if group.index_of(dst).is_none() || dst == self.engine.rank {
            bail!(
                "send from rank {} to rank {dst}: the destination must be another member of group {}",
                self.engine.rank,
                group_label(group)
            );
        }
        let buf = self.host(t, "send")?;
        let hash = group_hash(group);
        let seq = self.engine.next_seq(hash, Stream::SendTo(dst));
        let hdr = p2p_header(hash, seq, buf.dtype(), t.shape());
        self.engine.send_buffered(self.engine.tag(hash, true), dst, hdr.frame(&buf.to_le_bytes()))
    }

    fn recv(&self, group: &Group, t: &mut DeviceTensor, src: usize) -> Result<()> {
        self.engine.member(group)?;
        let rank = self.engine.rank;
        if group.index_of(src).is_none() || src == rank {
            bail!(
                "recv on rank {rank} from rank {src}: the source must be another member of group {}",
                group_label(group)
            );
        }
        let dtype = self.host(t, "recv")?.dtype();
        let hash = group_hash(group);
        let seq = self.engine.next_seq(hash, Stream::RecvFrom(src));
        let want = p2p_header(hash, seq, dtype, t.shape());
        let bytes = t.numel() * dtype.size();
        let timeout = self.engine.timeout;
        let label = group_label(group);
        let mut msgs = self.engine.exchange(
            self.engine.tag(hash, true),
            &[(src, want.words() * 8 + bytes)],
            Vec::new(),
            |_| format!("recv #{seq} from rank {src} on group {label} timed out after {timeout:?} on rank {rank}: rank {src} never sent it"),
        )?;
        let msg = msgs.pop().ok_or_else(|| anyhow!("internal error: no message"))?;
        let (h, payload) = Header::parse(&msg)?;
        let mut want = want;
        want.payload_bytes = bytes as u64;
        if h != want {
            bail!(
                "mismatched point-to-point transfer on group {label}: rank {src} sent {}, rank {rank} posted recv #{seq} \
                 of shape {:?} ({dtype})",
                describe(&h),
                t.shape()
            );
        }
        store(t, Payload::Tensor(HostBuffer::from_le_bytes(dtype, payload)?), "recv")
    }

    fn all_to_all(
        &self,
        group: &Group,
        input: &DeviceTensor,
        send_splits: &[usize],
        output: &mut DeviceTensor,
        recv_splits: &[usize],
    ) -> Result<()> {
        self.all_to_all_v(group, input, send_splits, output, recv_splits)
    }

    fn barrier(&self, group: &Group) -> Result<()> {
        let desc = OpDesc { kind: Kind::Barrier, op: None, dtype: None, len: 0, root: None };
        let c = self.start(group, desc)?;
        if group.size() > 1 {
            self.gather_all(&c, Vec::new())?;
        }
        Ok(())
    }

    /// Ends the whole job: MPI has no way to fail only the peers' pending calls, and a rank
    /// that failed must not leave the others hanging (the caller printed the reason first).
    fn abort(&self, reason: &str) {
        eprintln!("rank {} of {}: aborting the MPI job: {reason}", self.engine.rank, self.engine.size);
        ffi::abort(1);
    }
}

fn p2p_header(hash: u64, seq: u64, dtype: DType, shape: &[usize]) -> Header {
    Header {
        group: hash,
        seq,
        kind: P2P_KIND,
        op: 0,
        dtype: dtype_code(Some(dtype)),
        len: shape.iter().product::<usize>() as u64,
        root: 0,
        payload_bytes: 0,
        shape: shape.iter().map(|&d| d as u64).collect(),
    }
}

impl Drop for MpiCommunicator {
    fn drop(&mut self) {
        // Buffered sends must be received before the communicator goes; then MPI ends.
        let drained = self.engine.drain_sends();
        let _g = self.engine.lock();
        if drained {
            let _ = ffi::free_comm(self.engine.comm);
        }
        if let Err(e) = ffi::finalize() {
            eprintln!("rank {}: {e:#}", self.engine.rank);
        }
    }
}

//! What ranks put into a collective and the arithmetic done on it: rank-order reductions of
//! host buffers (f32 adds in f32 like NCCL; bf16/f16 accumulate in f32 and round once),
//! concatenation for all-gather and splitting for reduce-scatter.

use anyhow::{bail, Result};
use megatron_core::half::{bf16, f16};
use megatron_core::{DType, HostBuffer, ReduceOp};
use std::fmt;

/// One rank's contribution to (or share of the result of) a collective.
#[derive(Clone, Debug, PartialEq)]
pub enum Payload {
    Tensor(HostBuffer),
    F64(Vec<f64>),
    Empty,
    /// All-to-all input: the part for each group member, in group order.
    Parts(Vec<HostBuffer>),
}

impl Payload {
    pub fn len(&self) -> usize {
        match self {
            Payload::Tensor(b) => b.len(),
            Payload::F64(v) => v.len(),
            Payload::Empty => 0,
            Payload::Parts(p) => p.iter().map(HostBuffer::len).sum(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Which collective a rank called; every rank of a group must call the same one (same kind,
/// op, dtype, element count and root) at the same sequence number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    AllReduce,
    AllReduceF64,
    AllGather,
    ReduceScatter,
    Broadcast,
    Barrier,
    /// `len` is the group size (per-rank element counts differ).
    AllToAll,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpDesc {
    pub kind: Kind,
    pub op: Option<ReduceOp>,
    pub dtype: Option<DType>,
    /// Elements each rank contributes.
    pub len: usize,
    /// Broadcast root (global rank).
    pub root: Option<usize>,
}

impl fmt::Display for OpDesc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self.kind {
            Kind::AllReduce => "all_reduce",
            Kind::AllReduceF64 => "all_reduce_f64",
            Kind::AllGather => "all_gather",
            Kind::ReduceScatter => "reduce_scatter",
            Kind::Broadcast => "broadcast",
            Kind::Barrier => "barrier",
            Kind::AllToAll => "all_to_all",
        };
        write!(f, "{name}(")?;
        if let Some(op) = self.op {
            write!(f, "{}, ", if op == ReduceOp::Sum { "sum" } else { "max" })?;
        }
        match self.dtype {
            Some(d) => write!(f, "{d} x {}", self.len)?,
            None if self.kind == Kind::AllReduceF64 => write!(f, "f64 x {}", self.len)?,
            None => {}
        }
        if let Some(root) = self.root {
            write!(f, ", root {root}")?;
        }
        write!(f, ")")
    }
}

/// The result of a completed collective: one payload for everybody or one per group member.
#[derive(Debug)]
pub enum Outputs {
    Same(Payload),
    PerRank(Vec<Payload>),
}

/// Computes the outputs of `desc` from the inputs in group order.
pub fn compute(desc: &OpDesc, inputs: Vec<Payload>, root_index: Option<usize>) -> Result<Outputs> {
    let n = inputs.len();
    Ok(match desc.kind {
        Kind::Barrier => Outputs::Same(Payload::Empty),
        Kind::AllReduce | Kind::AllReduceF64 => Outputs::Same(reduce(inputs, desc.op.unwrap_or(ReduceOp::Sum))?),
        Kind::Broadcast => {
            let root = root_index.unwrap_or(0);
            Outputs::Same(inputs.into_iter().nth(root).unwrap_or(Payload::Empty))
        }
        Kind::AllGather => Outputs::Same(concat(inputs)?),
        Kind::ReduceScatter => {
            let reduced = reduce(inputs, desc.op.unwrap_or(ReduceOp::Sum))?;
            Outputs::PerRank(split(reduced, n)?)
        }
        Kind::AllToAll => Outputs::PerRank(transpose_parts(inputs)?),
    })
}

/// All-to-all: member `j` gets the `j`-th part of every input, concatenated in group order.
fn transpose_parts(inputs: Vec<Payload>) -> Result<Vec<Payload>> {
    let n = inputs.len();
    let mut columns: Vec<Vec<Payload>> = (0..n).map(|_| Vec::with_capacity(n)).collect();
    for (i, p) in inputs.into_iter().enumerate() {
        let Payload::Parts(parts) = p else { bail!("all_to_all input of member {i} is not split into parts") };
        if parts.len() != n {
            bail!("all_to_all input of member {i} has {} parts for a group of {n}", parts.len());
        }
        for (j, part) in parts.into_iter().enumerate() {
            columns[j].push(Payload::Tensor(part));
        }
    }
    columns.into_iter().map(concat).collect()
}

/// `b` cut into consecutive pieces of `counts` elements (which must add up to its length).
pub fn split_counts(b: &HostBuffer, counts: &[usize]) -> Result<Vec<HostBuffer>> {
    if counts.iter().sum::<usize>() != b.len() {
        bail!("split counts {counts:?} do not add up to the {} elements", b.len());
    }
    fn cut<T: Clone>(v: &[T], counts: &[usize], wrap: fn(Vec<T>) -> HostBuffer) -> Vec<HostBuffer> {
        let mut off = 0;
        counts
            .iter()
            .map(|&c| {
                off += c;
                wrap(v[off - c..off].to_vec())
            })
            .collect()
    }
    Ok(match b {
        HostBuffer::F32(v) => cut(v, counts, HostBuffer::F32),
        HostBuffer::BF16(v) => cut(v, counts, HostBuffer::BF16),
        HostBuffer::F16(v) => cut(v, counts, HostBuffer::F16),
        HostBuffer::I32(v) => cut(v, counts, HostBuffer::I32),
        HostBuffer::I64(v) => cut(v, counts, HostBuffer::I64),
        HostBuffer::U8(v) => cut(v, counts, HostBuffer::U8),
        HostBuffer::U16(v) => cut(v, counts, HostBuffer::U16),
    })
}

fn max_f32(a: f32, b: f32) -> f32 {
    // NaN propagates, so a MAX reduction of "found inf/NaN" values cannot lose it.
    if a.is_nan() || b.is_nan() {
        f32::NAN
    } else {
        a.max(b)
    }
}

fn max_f64(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.max(b)
    }
}

/// Elementwise reduction in group (= rank) order: `((x0 + x1) + x2) + ...`. Public so the
/// `mpi` communicator reduces with the same arithmetic (bit-identical results).
pub fn reduce(inputs: Vec<Payload>, op: ReduceOp) -> Result<Payload> {
    let mut it = inputs.into_iter();
    let Some(mut acc) = it.next() else { bail!("a collective with no participants") };
    // bf16/f16 accumulate in f32 and round once at the end.
    let mut wide: Option<Vec<f32>> = match &acc {
        Payload::Tensor(HostBuffer::BF16(_)) | Payload::Tensor(HostBuffer::F16(_)) => match &acc {
            Payload::Tensor(b) => Some(b.to_f32_vec()),
            _ => None,
        },
        _ => None,
    };
    for x in it {
        if x.len() != acc.len() {
            bail!("reduction inputs of {} and {} elements", acc.len(), x.len());
        }
        match (&mut acc, x, wide.as_mut()) {
            (Payload::F64(a), Payload::F64(b), _) => combine(a, &b, |p, q| p + q, max_f64, op),
            (Payload::Tensor(_), Payload::Tensor(b), Some(w)) => {
                combine(w, &b.to_f32_vec(), |p, q| p + q, max_f32, op);
            }
            (Payload::Tensor(HostBuffer::F32(a)), Payload::Tensor(HostBuffer::F32(b)), None) => {
                combine(a, &b, |p, q| p + q, max_f32, op)
            }
            (Payload::Tensor(HostBuffer::I32(a)), Payload::Tensor(HostBuffer::I32(b)), None) => {
                combine(a, &b, i32::wrapping_add, Ord::max, op)
            }
            (Payload::Tensor(HostBuffer::I64(a)), Payload::Tensor(HostBuffer::I64(b)), None) => {
                combine(a, &b, i64::wrapping_add, Ord::max, op)
            }
            (Payload::Tensor(HostBuffer::U8(a)), Payload::Tensor(HostBuffer::U8(b)), None) => {
                combine(a, &b, u8::wrapping_add, Ord::max, op)
            }
            (Payload::Tensor(HostBuffer::U16(a)), Payload::Tensor(HostBuffer::U16(b)), None) => {
                combine(a, &b, u16::wrapping_add, Ord::max, op)
            }
            (a, b, _) => bail!("cannot reduce {a:?} with {b:?} (dtypes differ)"),
        }
    }
    if let (Some(w), Payload::Tensor(b)) = (wide, &mut acc) {
        *b = match b {
            HostBuffer::BF16(_) => HostBuffer::BF16(w.iter().map(|&x| bf16::from_f32(x)).collect()),
            _ => HostBuffer::F16(w.iter().map(|&x| f16::from_f32(x)).collect()),
        };
    }
    Ok(acc)
}

fn combine<T: Copy>(acc: &mut [T], x: &[T], add: impl Fn(T, T) -> T, max: impl Fn(T, T) -> T, op: ReduceOp) {
    match op {
        ReduceOp::Sum => acc.iter_mut().zip(x).for_each(|(a, &b)| *a = add(*a, b)),
        ReduceOp::Max => acc.iter_mut().zip(x).for_each(|(a, &b)| *a = max(*a, b)),
    }
}

/// Concatenates host buffers of one dtype in group order.
pub fn concat(inputs: Vec<Payload>) -> Result<Payload> {
    let mut it = inputs.into_iter();
    let Some(Payload::Tensor(mut acc)) = it.next() else { bail!("all_gather needs tensor inputs") };
    for x in it {
        match (&mut acc, x) {
            (HostBuffer::F32(a), Payload::Tensor(HostBuffer::F32(b))) => a.extend(b),
            (HostBuffer::BF16(a), Payload::Tensor(HostBuffer::BF16(b))) => a.extend(b),
            (HostBuffer::F16(a), Payload::Tensor(HostBuffer::F16(b))) => a.extend(b),
            (HostBuffer::I32(a), Payload::Tensor(HostBuffer::I32(b))) => a.extend(b),
            (HostBuffer::I64(a), Payload::Tensor(HostBuffer::I64(b))) => a.extend(b),
            (HostBuffer::U8(a), Payload::Tensor(HostBuffer::U8(b))) => a.extend(b),
            (HostBuffer::U16(a), Payload::Tensor(HostBuffer::U16(b))) => a.extend(b),
            (a, b) => bail!("cannot concatenate {} with {b:?}", a.dtype()),
        }
    }
    Ok(Payload::Tensor(acc))
}

/// `n` equal consecutive chunks (reduce-scatter's per-rank shares).
fn split(p: Payload, n: usize) -> Result<Vec<Payload>> {
    let Payload::Tensor(b) = p else { bail!("reduce_scatter needs a tensor") };
    if n == 0 || !b.len().is_multiple_of(n) {
        bail!("cannot split {} elements into {n} equal parts", b.len());
    }
    let c = b.len() / n;
    fn chunks<T: Clone>(v: &[T], c: usize, wrap: fn(Vec<T>) -> HostBuffer) -> Vec<Payload> {
        v.chunks(c.max(1)).map(|s| Payload::Tensor(wrap(s.to_vec()))).collect()
    }
    let out = match &b {
        HostBuffer::F32(v) => chunks(v, c, HostBuffer::F32),
        HostBuffer::BF16(v) => chunks(v, c, HostBuffer::BF16),
        HostBuffer::F16(v) => chunks(v, c, HostBuffer::F16),
        HostBuffer::I32(v) => chunks(v, c, HostBuffer::I32),
        HostBuffer::I64(v) => chunks(v, c, HostBuffer::I64),
        HostBuffer::U8(v) => chunks(v, c, HostBuffer::U8),
        HostBuffer::U16(v) => chunks(v, c, HostBuffer::U16),
    };
    if out.len() != n {
        // Only for zero-length tensors: every rank gets an empty share.
        return Ok((0..n).map(|_| Payload::Tensor(HostBuffer::zeros(b.dtype(), 0))).collect());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f32_sum_is_in_rank_order() {
        // (1e8 + 1) + (-1e8) = 0 in f32, while 1e8 + (-1e8) + 1 = 1: the order is rank order.
        let ins = [1e8f32, 1.0, -1e8].map(|x| Payload::Tensor(HostBuffer::F32(vec![x]))).to_vec();
        assert_eq!(reduce(ins, ReduceOp::Sum).unwrap(), Payload::Tensor(HostBuffer::F32(vec![0.0])));
    }

    #[test]
    fn bf16_accumulates_wide_and_max_keeps_nan() {
        let ins = [256.0f32, 1.0, 1.0].map(|x| Payload::Tensor(HostBuffer::BF16(vec![bf16::from_f32(x)]))).to_vec();
        // In bf16 steps 256 + 1 = 256 twice; accumulated in f32 it is 258 (representable).
        assert_eq!(reduce(ins, ReduceOp::Sum).unwrap(), Payload::Tensor(HostBuffer::BF16(vec![bf16::from_f32(258.0)])));
        let ins = vec![Payload::F64(vec![1.0, f64::NAN]), Payload::F64(vec![2.0, 0.0])];
        let Payload::F64(v) = reduce(ins, ReduceOp::Max).unwrap() else { panic!("f64 payload") };
        assert_eq!(v[0], 2.0);
        assert!(v[1].is_nan());
    }
}

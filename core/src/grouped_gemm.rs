//! The grouped GEMM op of [`crate::GemmOps::grouped_gemm`]: many independent matmuls of
//! different sizes in one call (MoE experts, each on its own group of tokens), so a backend
//! can schedule all of them at once instead of paying one launch/fork-join per expert.

use crate::{DeviceTensor, GemmOps, GemmSpec, HostBuffer, Result};
use anyhow::bail;

/// One problem: `C_g[m,n] = alpha·op(A_g)[m,k]·op(B_g)[k,n] + beta·C_g`, every operand a
/// contiguous row-major block starting at the given element offset of the shared buffers
/// (`A_g` stored `[m,k]`, or `[k,m]` with `trans_a`; `B_g` `[k,n]`, or `[n,k]` with `trans_b`).
/// The `C` blocks of one call must not overlap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemmGroup {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub a_offset: usize,
    pub b_offset: usize,
    pub c_offset: usize,
}

/// Transposes and scales shared by every group of one call.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GroupedGemmSpec {
    pub trans_a: bool,
    pub trans_b: bool,
    pub alpha: f32,
    pub beta: f32,
}

/// Checks every block is inside its buffer and the `C` blocks are disjoint; returns the
/// groups ordered by `c_offset`.
pub fn check_groups(groups: &[GemmGroup], a_len: usize, b_len: usize, c_len: usize) -> Result<Vec<GemmGroup>> {
    for (i, g) in groups.iter().enumerate() {
        let fits = |off: usize, len: usize, total: usize| off.checked_add(len).is_some_and(|e| e <= total);
        if !fits(g.a_offset, g.m * g.k, a_len)
            || !fits(g.b_offset, g.k * g.n, b_len)
            || !fits(g.c_offset, g.m * g.n, c_len)
        {
            bail!("grouped_gemm group {i} ({g:?}) reaches past its buffers (a {a_len}, b {b_len}, c {c_len} elements)");
        }
    }
    let mut sorted: Vec<GemmGroup> = groups.iter().copied().filter(|g| g.m * g.n > 0).collect();
    sorted.sort_by_key(|g| g.c_offset);
    for w in sorted.windows(2) {
        if w[0].c_offset + w[0].m * w[0].n > w[1].c_offset {
            bail!("grouped_gemm output blocks {:?} and {:?} overlap", w[0], w[1]);
        }
    }
    Ok(sorted)
}

/// The portable fallback: one [`GemmOps::gemm`] per group on host copies of the blocks.
pub fn grouped_gemm_by_loop<B: GemmOps + ?Sized>(
    backend: &B,
    a: &DeviceTensor,
    b: &DeviceTensor,
    c: &mut DeviceTensor,
    groups: &[GemmGroup],
    spec: GroupedGemmSpec,
) -> Result<()> {
    let (av, bv) = (backend.to_host(a)?.to_f32_vec(), backend.to_host(b)?.to_f32_vec());
    let mut cv = backend.to_host(c)?.to_f32_vec();
    for g in check_groups(groups, av.len(), bv.len(), cv.len())? {
        let block = |v: &[f32], off: usize, len: usize, shape: &[usize]| {
            backend.from_host(HostBuffer::F32(v[off..off + len].to_vec()), shape)
        };
        let at = block(&av, g.a_offset, g.m * g.k, &[g.m * g.k])?;
        let bt = block(&bv, g.b_offset, g.k * g.n, &[g.k * g.n])?;
        let mut ct = block(&cv, g.c_offset, g.m * g.n, &[g.m * g.n])?;
        let gs = GemmSpec {
            m: g.m,
            n: g.n,
            k: g.k,
            trans_a: spec.trans_a,
            trans_b: spec.trans_b,
            alpha: spec.alpha,
            beta: spec.beta,
        };
        backend.gemm(&at, &bt, &mut ct, gs, None)?;
        cv[g.c_offset..g.c_offset + g.m * g.n].copy_from_slice(&backend.to_host(&ct)?.to_f32_vec());
    }
    let shape = c.shape().to_vec();
    *c = backend.from_host(HostBuffer::F32(cv), &shape)?;
    Ok(())
}

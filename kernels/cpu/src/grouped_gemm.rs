//! The grouped GEMM (MoE experts): every group's output is cut into row tiles and all tiles of
//! all groups are one rayon pass, each tile a single-threaded `gemm` call. A loop of
//! per-expert `gemm` calls instead forks and joins the pool once per expert, which dominates
//! when experts get few tokens (measured in `plugins/moe`'s `grouped_gemm` bench).

use crate::check::{f32s, f32s_mut};
use crate::gemm::{gemm_strided, Mat};
use gemm::Parallelism;
use megatron_core::anyhow::bail;
use megatron_core::grouped_gemm::{check_groups, GemmGroup, GroupedGemmSpec};
use megatron_core::{DeviceTensor, Result};
use rayon::prelude::*;

/// Output rows per task: large enough to amortise the kernel's packing, small enough that a
/// few experts still spread over every thread.
const TILE_ROWS: usize = 32;

pub(crate) fn grouped_gemm_op(
    a: &DeviceTensor,
    b: &DeviceTensor,
    c: &mut DeviceTensor,
    groups: &[GemmGroup],
    spec: GroupedGemmSpec,
) -> Result<()> {
    let (av, bv) = (f32s("grouped_gemm", "a", a)?, f32s("grouped_gemm", "b", b)?);
    let cv = f32s_mut("grouped_gemm", "c", c)?;
    if !spec.alpha.is_finite() || !spec.beta.is_finite() {
        bail!("cpu backend: `grouped_gemm` needs finite alpha and beta, got {spec:?}");
    }
    let sorted = check_groups(groups, av.len(), bv.len(), cv.len())?;
    // Carve C into the groups' disjoint blocks, then each block into row tiles.
    let mut tasks: Vec<(GemmGroup, usize, &mut [f32])> = Vec::new();
    let mut rest: &mut [f32] = cv;
    let mut consumed = 0;
    for g in sorted {
        let (_, tail) = std::mem::take(&mut rest).split_at_mut(g.c_offset - consumed);
        let (block, tail) = tail.split_at_mut(g.m * g.n);
        rest = tail;
        consumed = g.c_offset + g.m * g.n;
        for (t, rows) in block.chunks_mut(TILE_ROWS * g.n).enumerate() {
            tasks.push((g, t * TILE_ROWS, rows));
        }
    }
    tasks.into_par_iter().for_each(|(g, row0, dst)| {
        let rows = dst.len() / g.n;
        // Row r of op(A) starts at row0 + r; op(B) is the whole B_g.
        let lhs = if spec.trans_a {
            Mat { data: av, off: g.a_offset + row0, rs: 1, cs: g.m }
        } else {
            Mat { data: av, off: g.a_offset + row0 * g.k, rs: g.k, cs: 1 }
        };
        let rhs = if spec.trans_b {
            Mat { data: bv, off: g.b_offset, rs: 1, cs: g.k }
        } else {
            Mat { data: bv, off: g.b_offset, rs: g.n, cs: 1 }
        };
        gemm_strided(rows, g.n, g.k, dst, g.n, spec.beta, lhs, rhs, spec.alpha, Parallelism::None);
    });
    Ok(())
}

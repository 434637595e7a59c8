//! Vocab-parallel embedding lookup and its backward (SPEC §5.2): this rank owns table rows
//! `[row_start, row_start + rows)`; ids outside contribute zeros (the all-reduce across the
//! tensor-parallel group fills them in).

use crate::check::{f32s, f32s_mut, i32s, numel, rows_cols};
use megatron_core::anyhow::bail;
use megatron_core::{DeviceTensor, Result};
use rayon::prelude::*;

/// The local table row of `id`, if this rank owns it.
#[inline]
fn local_row(id: i32, row_start: usize, rows: usize) -> Option<usize> {
    let id = usize::try_from(id).ok()?;
    (id >= row_start && id < row_start + rows).then(|| id - row_start)
}

pub(crate) fn embedding_forward(
    ids: &DeviceTensor,
    table: &DeviceTensor,
    row_start: usize,
    out: &mut DeviceTensor,
    accumulate: bool,
) -> Result<()> {
    const OP: &str = "embedding_forward";
    let (rows, c) = rows_cols(OP, "table", table)?;
    let n = ids.numel();
    numel(OP, "out", out, n * c, &format!("[N={n}, C={c}]"))?;
    let (idv, tv) = (i32s(OP, "ids", ids)?, f32s(OP, "table", table)?);
    let o = f32s_mut(OP, "out", out)?;
    o.par_chunks_mut(c).zip(idv.par_iter()).for_each(|(o, &id)| match local_row(id, row_start, rows) {
        Some(r) => {
            let src = &tv[r * c..(r + 1) * c];
            if accumulate {
                o.iter_mut().zip(src).for_each(|(o, &s)| *o += s);
            } else {
                o.copy_from_slice(src);
            }
        }
        None if !accumulate => o.fill(0.0),
        None => {}
    });
    Ok(())
}

pub(crate) fn embedding_backward(
    ids: &DeviceTensor,
    d_out: &DeviceTensor,
    row_start: usize,
    d_table: &mut DeviceTensor,
) -> Result<()> {
    const OP: &str = "embedding_backward";
    let (rows, c) = rows_cols(OP, "d_table", d_table)?;
    let n = ids.numel();
    numel(OP, "d_out", d_out, n * c, &format!("[N={n}, C={c}]"))?;
    let (idv, dy) = (i32s(OP, "ids", ids)?, f32s(OP, "d_out", d_out)?);
    let dt = f32s_mut(OP, "d_table", d_table)?;
    if c == 0 {
        bail!("cpu backend: `{OP}` needs a non-empty embedding dim");
    }
    // Repeated ids would race if rows were split across threads, so threads split the columns:
    // each owns a band of every table row and walks all ids in order (deterministic sums).
    let band = c.div_ceil(rayon::current_num_threads().max(1) * 2).max(16).min(c);
    let bands = c.div_ceil(band);
    let dt_addr = dt.as_mut_ptr() as usize;
    (0..bands).into_par_iter().for_each(|bi| {
        let (lo, hi) = (bi * band, ((bi + 1) * band).min(c));
        for (i, &id) in idv.iter().enumerate() {
            if let Some(r) = local_row(id, row_start, rows) {
                let src = &dy[i * c + lo..i * c + hi];
                // SAFETY: bands [lo, hi) are disjoint across tasks, so no two tasks write the same
                // element; the range lies inside `dt` because r < rows and hi <= c.
                let dst = unsafe { std::slice::from_raw_parts_mut((dt_addr as *mut f32).add(r * c + lo), hi - lo) };
                dst.iter_mut().zip(src).for_each(|(d, &s)| *d += s);
            }
        }
    });
    Ok(())
}

//! The task driver: `C` split into `(row block, column range)` tiles run on the rayon pool,
//! each running the whole `K` loop in a fixed order, and the epilogue that rounds a microtile
//! into `C`.

use super::micro::Micro;
use super::pack::{k_blocks, Elem};
use super::{KC, MC, MIN_TASKS, MR, NR};
use crate::widen::bf16_bits;
use megatron_core::half::{bf16, f16};
use rayon::prelude::*;
use std::cell::RefCell;

/// Raw access to `C` for tasks that own disjoint tiles.
#[derive(Clone, Copy)]
pub(super) enum CPtr {
    F32(*mut f32),
    BF16(*mut bf16),
    F16(*mut f16),
}
// SAFETY: tasks write disjoint elements of the exclusively borrowed `C` (see `run_tasks`).
unsafe impl Send for CPtr {}
unsafe impl Sync for CPtr {}

/// Problem description shared by every task.
pub(super) struct Job<'a> {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub alpha: f32,
    pub beta: f32,
    pub bias: Option<&'a [f32]>,
    pub c: CPtr,
}

thread_local! {
    pub(super) static PACK_U16: RefCell<Vec<u16>> = const { RefCell::new(Vec::new()) };
    pub(super) static PACK_F32: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    static TILE: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` with this thread's scratch vector resized to `n` (contents unspecified).
fn with_scratch<T: Elem, R>(
    key: &'static std::thread::LocalKey<RefCell<Vec<T>>>,
    n: usize,
    f: impl FnOnce(&mut [T]) -> R,
) -> R {
    let mut buf = key.with(|c| std::mem::take(&mut *c.borrow_mut()));
    if buf.len() < n {
        buf.resize(n, T::ZERO);
    }
    let r = f(&mut buf[..n]);
    key.with(|c| *c.borrow_mut() = buf);
    r
}
/// Splits `C` into tasks and runs them on the current rayon pool.
pub(super) fn run_tasks<E: Micro>(job: &Job, pb: &[E], pack_a: impl Fn(usize, usize, usize, &mut [E]) + Sync) {
    let (m, n) = (job.m, job.n);
    let m_blocks = m.div_ceil(MC);
    let panels = n.div_ceil(NR);
    // Column split only to have enough tasks; it changes which task computes an element, never how.
    let n_split = MIN_TASKS.div_ceil(m_blocks).clamp(1, panels);
    let per = panels.div_ceil(n_split);
    let tasks: Vec<(usize, usize, usize)> = (0..m_blocks)
        .flat_map(|ib| (0..panels).step_by(per).map(move |jr0| (ib, jr0, (jr0 + per).min(panels))))
        .collect();
    tasks.into_par_iter().for_each(|(ib, jr0, jr1)| task::<E>(job, pb, &pack_a, ib * MC, jr0, jr1));
}

/// Rows `[i0, i0+MC)` × panels `[jr0, jr1)` of `C`.
fn task<E: Micro>(
    job: &Job,
    pb: &[E],
    pack_a: &impl Fn(usize, usize, usize, &mut [E]),
    i0: usize,
    jr0: usize,
    jr1: usize,
) {
    let (m, n, k) = (job.m, job.n, job.k);
    let mc = MC.min(m - i0);
    let mpanels = mc.div_ceil(MR);
    let blocks = k_blocks(k);
    let panels = n.div_ceil(NR);
    let tile_w = (jr1 - jr0) * NR;
    let tile_len = if blocks.len() > 1 { mpanels * MR * tile_w } else { 0 };
    with_scratch(E::scratch(), mpanels * KC * MR, |pa| {
        with_scratch(&TILE, tile_len, |tile| {
            if blocks.is_empty() {
                // K = 0: only the epilogue (alpha·0 + beta·C + bias).
                let acc = [[0.0f32; NR]; MR];
                for jr in jr0..jr1 {
                    for ir in 0..mpanels {
                        epilogue(job, &acc, i0 + ir * MR, jr * NR, None);
                    }
                }
                return;
            }
            let mut kbase = 0; // pairs before this block
            for (bi, &(k0, kc)) in blocks.iter().enumerate() {
                let kp = kc.div_ceil(2);
                let panel_a = kp * 2 * MR;
                for ir in 0..mpanels {
                    pack_a(i0 + ir * MR, k0, kc, &mut pa[ir * panel_a..(ir + 1) * panel_a]);
                }
                let (first, last) = (bi == 0, bi + 1 == blocks.len());
                let block_b = &pb[kbase * 2 * panels * NR..];
                let mut acc = [[0.0f32; NR]; MR];
                for jr in jr0..jr1 {
                    let bpanel = &block_b[jr * kp * 2 * NR..(jr + 1) * kp * 2 * NR];
                    for ir in 0..mpanels {
                        E::kernel(kp, &pa[ir * panel_a..(ir + 1) * panel_a], bpanel, &mut acc);
                        let t_off = ir * MR * tile_w + (jr - jr0) * NR;
                        if last {
                            let partial = (!first).then(|| &tile[t_off..]);
                            epilogue(job, &acc, i0 + ir * MR, jr * NR, partial.map(|t| (t, tile_w)));
                        } else {
                            for (r, row) in acc.iter().enumerate() {
                                let t = &mut tile[t_off + r * tile_w..t_off + r * tile_w + NR];
                                if first {
                                    t.copy_from_slice(row);
                                } else {
                                    t.iter_mut().zip(row).for_each(|(t, &x)| *t += x);
                                }
                            }
                        }
                    }
                }
                kbase += kp;
            }
        })
    })
}

/// Writes one microtile: `C = alpha·(acc + partial) + beta·C + bias`, rounded to `C`'s dtype.
#[inline(always)]
fn epilogue(job: &Job, acc: &[[f32; NR]; MR], i0: usize, j0: usize, partial: Option<(&[f32], usize)>) {
    let rows = MR.min(job.m.saturating_sub(i0));
    let cols = NR.min(job.n - j0);
    let mut v = [0.0f32; NR];
    for (r, row) in acc.iter().enumerate().take(rows) {
        let v = &mut v[..cols];
        v.copy_from_slice(&row[..cols]);
        if let Some((t, w)) = partial {
            v.iter_mut().zip(&t[r * w..r * w + cols]).for_each(|(x, &p)| *x += p);
        }
        v.iter_mut().for_each(|x| *x *= job.alpha);
        if let Some(bias) = job.bias {
            v.iter_mut().zip(&bias[j0..j0 + cols]).for_each(|(x, &b)| *x += b);
        }
        let off = (i0 + r) * job.n + j0;
        // SAFETY: row i0+r < m and columns [j0, j0+cols) < n lie inside `C` (m·n elements), and
        // this microtile belongs to the calling task only.
        unsafe {
            match job.c {
                CPtr::F32(p) => {
                    let c = std::slice::from_raw_parts_mut(p.add(off), cols);
                    if job.beta != 0.0 {
                        v.iter_mut().zip(c.iter()).for_each(|(x, &c)| *x += job.beta * c);
                    }
                    c.copy_from_slice(v);
                }
                CPtr::BF16(p) => {
                    let c = std::slice::from_raw_parts_mut(p.add(off), cols);
                    if job.beta != 0.0 {
                        v.iter_mut().zip(c.iter()).for_each(|(x, &c)| *x += job.beta * c.to_f32());
                    }
                    c.iter_mut().zip(v.iter()).for_each(|(c, &x)| *c = bf16::from_bits(bf16_bits(x)));
                }
                CPtr::F16(p) => {
                    let c = std::slice::from_raw_parts_mut(p.add(off), cols);
                    if job.beta != 0.0 {
                        v.iter_mut().zip(c.iter()).for_each(|(x, &c)| *x += job.beta * c.to_f32());
                    }
                    c.iter_mut().zip(v.iter()).for_each(|(c, &x)| *c = f16::from_f32(x));
                }
            }
        }
    }
}

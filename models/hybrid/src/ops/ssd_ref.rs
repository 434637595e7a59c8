//! The sequential recurrence of the SSD scan, forward and backward: the oracle of
//! [`super::ssd`]. Per `(b, h)`, with `α_t = exp(Δ_t A)`:
//! `s_t = α_t s_{t-1} + Δ_t B_t x_tᵀ` (`s_{-1} = 0`), `y_t = C_tᵀ s_t + D x_t`.
//! Backward runs `t` downwards carrying `ds = dL/ds_t`; it keeps every state `(T, N, P)`, so it
//! is for tests only. Plain loops, no parallelism.

use super::ssd::{check, SsdGrads, SsdInputs};
use super::SsdDims;
use anyhow::Result;

struct Idx {
    seq: usize,
    heads: usize,
    p: usize,
    groups: usize,
    n: usize,
}

impl Idx {
    fn new(d: &SsdDims) -> Idx {
        Idx { seq: d.seq, heads: d.heads, p: d.head_dim, groups: d.groups, n: d.state }
    }
    fn x(&self, b: usize, t: usize, h: usize, p: usize) -> usize {
        ((b * self.seq + t) * self.heads + h) * self.p + p
    }
    fn dt(&self, b: usize, t: usize, h: usize) -> usize {
        (b * self.seq + t) * self.heads + h
    }
    fn bc(&self, b: usize, t: usize, h: usize, n: usize) -> usize {
        let g = h / (self.heads / self.groups);
        ((b * self.seq + t) * self.groups + g) * self.n + n
    }
}

/// All states `s_t (B, H, T, N, P)` and `y (B, T, H, P)`.
fn run(dims: &SsdDims, i: &SsdInputs) -> (Vec<f32>, Vec<f32>) {
    let ix = Idx::new(dims);
    let SsdDims { batch, seq, heads, head_dim: pp, state: nn, .. } = *dims;
    let mut y = vec![0.0f32; batch * seq * heads * pp];
    let mut all = vec![0.0f32; batch * heads * seq * nn * pp];
    for b in 0..batch {
        for h in 0..heads {
            let mut s = vec![0.0f32; nn * pp];
            for t in 0..seq {
                let dt = i.dt[ix.dt(b, t, h)];
                let alpha = (dt * i.a[h]).exp();
                for n in 0..nn {
                    for p in 0..pp {
                        s[n * pp + p] = alpha * s[n * pp + p] + dt * i.bm[ix.bc(b, t, h, n)] * i.x[ix.x(b, t, h, p)];
                    }
                }
                for p in 0..pp {
                    let mut acc = i.d[h] * i.x[ix.x(b, t, h, p)];
                    for n in 0..nn {
                        acc += i.cm[ix.bc(b, t, h, n)] * s[n * pp + p];
                    }
                    y[ix.x(b, t, h, p)] = acc;
                }
                let o = ((b * heads + h) * seq + t) * nn * pp;
                all[o..o + nn * pp].copy_from_slice(&s);
            }
        }
    }
    (y, all)
}

/// `y (B, T, H, P)` by the sequential recurrence.
pub fn ssd_reference_forward(dims: &SsdDims, i: &SsdInputs) -> Result<Vec<f32>> {
    check(dims, i)?;
    Ok(run(dims, i).0)
}

/// Gradients of every input from `dy (B, T, H, P)` by the reverse recurrence.
pub fn ssd_reference_backward(dims: &SsdDims, i: &SsdInputs, dy: &[f32]) -> Result<SsdGrads> {
    check(dims, i)?;
    let ix = Idx::new(dims);
    let SsdDims { batch, seq, heads, head_dim: pp, state: nn, .. } = *dims;
    let (_, all) = run(dims, i);
    let mut g = SsdGrads {
        x: vec![0.0; i.x.len()],
        dt: vec![0.0; i.dt.len()],
        a: vec![0.0; heads],
        bm: vec![0.0; i.bm.len()],
        cm: vec![0.0; i.cm.len()],
        d: vec![0.0; heads],
    };
    for b in 0..batch {
        for h in 0..heads {
            let mut ds = vec![0.0f32; nn * pp];
            let state = |t: usize| &all[((b * heads + h) * seq + t) * nn * pp..][..nn * pp];
            for t in (0..seq).rev() {
                let s_t = state(t);
                for p in 0..pp {
                    let dy_tp = dy[ix.x(b, t, h, p)];
                    g.d[h] += dy_tp * i.x[ix.x(b, t, h, p)];
                    g.x[ix.x(b, t, h, p)] += i.d[h] * dy_tp;
                    for n in 0..nn {
                        ds[n * pp + p] += i.cm[ix.bc(b, t, h, n)] * dy_tp;
                        g.cm[ix.bc(b, t, h, n)] += dy_tp * s_t[n * pp + p];
                    }
                }
                let dt = i.dt[ix.dt(b, t, h)];
                let alpha = (dt * i.a[h]).exp();
                let mut d_alpha = 0.0f32;
                let mut d_dt = 0.0f32;
                for n in 0..nn {
                    for p in 0..pp {
                        let dsv = ds[n * pp + p];
                        if t > 0 {
                            d_alpha += dsv * state(t - 1)[n * pp + p];
                        }
                        let (bv, xv) = (i.bm[ix.bc(b, t, h, n)], i.x[ix.x(b, t, h, p)]);
                        d_dt += dsv * bv * xv;
                        g.bm[ix.bc(b, t, h, n)] += dt * dsv * xv;
                        g.x[ix.x(b, t, h, p)] += dt * dsv * bv;
                    }
                }
                g.dt[ix.dt(b, t, h)] += d_dt + d_alpha * alpha * i.a[h];
                g.a[h] += d_alpha * alpha * dt;
                ds.iter_mut().for_each(|v| *v *= alpha);
            }
        }
    }
    Ok(g)
}

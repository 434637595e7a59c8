//! The forward halves of the token dispatchers of [`MoeLayer`] (the backward halves sit in
//! its `backward`): `alltoall` permutes this rank's tokens by expert and exchanges them with
//! the experts' ranks; `allgather` gathers every rank's tokens and routes and reduce-scatters
//! the local experts' partial outputs.

use super::MoeLayer;
use crate::dispatch::{gather_rows, regroup, scatter_rows};
use anyhow::Result;

impl MoeLayer {
    pub(super) fn forward_alltoall(
        &mut self,
        xv: &[f32],
        idx: &[i32],
        gate: &[f32],
        kept: &[f32],
        n: usize,
    ) -> Result<Vec<f32>> {
        let (c, k, local, ep) = (self.hidden, self.cfg.moe_router_topk, self.local, self.ep.size);
        let perm = Self::sorted_assignments(idx, kept, |_| true);
        // Rows [x | gate] to the expert's rank; counts per (destination, local expert).
        let mut counts = vec![0usize; ep * local];
        let mut rows = Vec::with_capacity(perm.len() * (c + 1));
        for &a in &perm {
            counts[idx[a] as usize] += 1;
            rows.extend_from_slice(&xv[(a / k) * c..(a / k + 1) * c]);
            rows.push(gate[a]);
        }
        let send: Vec<usize> = counts.chunks(local).map(|ch| ch.iter().sum()).collect();
        let (recv_rows, counts_from) = if ep > 1 {
            let cf: Vec<f32> = counts.iter().map(|&v| v as f32).collect();
            let got = self.ep.all_to_all(cf, 1, &vec![local; ep], &vec![local; ep])?;
            let counts_from: Vec<usize> = got.iter().map(|&v| v as usize).collect();
            let recv: Vec<usize> = counts_from.chunks(local).map(|ch| ch.iter().sum()).collect();
            (self.ep.all_to_all(rows, c + 1, &send, &recv)?, counts_from)
        } else {
            (rows, counts.clone())
        };
        let recv: Vec<usize> = counts_from.chunks(local).map(|ch| ch.iter().sum()).collect();
        let (order, sizes) = regroup(&counts_from, ep, local);
        let grouped = gather_rows(&recv_rows, c + 1, &order);
        let z = self.run_experts(&grouped, &sizes, n)?;
        let z_back = scatter_rows(&z, c, &order);
        let z_back = if ep > 1 { self.ep.all_to_all(z_back, c, &recv, &send)? } else { z_back };
        let mut out = vec![0.0f32; n * c];
        for (r, &a) in perm.iter().enumerate() {
            let t = a / k;
            out[t * c..(t + 1) * c].iter_mut().zip(&z_back[r * c..(r + 1) * c]).for_each(|(o, v)| *o += v);
        }
        let splits: Vec<usize> = send.iter().chain(&recv).copied().collect();
        self.saved.perm = self.i32_tensor(&perm)?;
        self.saved.splits = self.i32_tensor(&splits)?;
        self.saved.order = self.i32_tensor(&order)?;
        Ok(out)
    }

    pub(super) fn forward_allgather(
        &mut self,
        xv: &[f32],
        idx: &[i32],
        gate: &[f32],
        kept: &[f32],
        n: usize,
    ) -> Result<Vec<f32>> {
        let (c, k, local) = (self.hidden, self.cfg.moe_router_topk, self.local);
        let x_all = self.ep.all_gather(xv.to_vec(), c)?;
        let route: Vec<f32> = (0..n * k).flat_map(|a| [idx[a] as f32, gate[a], kept[a]]).collect();
        let route = self.ep.all_gather(route, 3 * k)?;
        let (idx_all, gate_all, kept_all): (Vec<i32>, Vec<f32>, Vec<f32>) = {
            let (mut i, mut g, mut m) = (Vec::new(), Vec::new(), Vec::new());
            for r in route.chunks(3) {
                i.push(r[0] as i32);
                g.push(r[1]);
                m.push(r[2]);
            }
            (i, g, m)
        };
        let first = (self.ep.rank * local) as i32;
        let perm = Self::sorted_assignments(&idx_all, &kept_all, |j| j >= first && j < first + local as i32);
        let mut sizes = vec![0usize; local];
        let mut rows = Vec::with_capacity(perm.len() * (c + 1));
        for &a in &perm {
            sizes[(idx_all[a] - first) as usize] += 1;
            rows.extend_from_slice(&x_all[(a / k) * c..(a / k + 1) * c]);
            rows.push(gate_all[a]);
        }
        let z = self.run_experts(&rows, &sizes, n)?;
        let mut partial = vec![0.0f32; x_all.len()];
        for (r, &a) in perm.iter().enumerate() {
            let t = a / k;
            partial[t * c..(t + 1) * c].iter_mut().zip(&z[r * c..(r + 1) * c]).for_each(|(o, v)| *o += v);
        }
        self.saved.perm = self.i32_tensor(&perm)?;
        self.saved.splits = self.i32_tensor(&[])?;
        self.saved.order = self.i32_tensor(&[])?;
        self.ep.reduce_scatter(partial, c)
    }
}

//! [`MoeLayer`]: the `MlpModule` the plugin puts into an MLP slot (Megatron's `MoELayer`):
//! router → dispatch → grouped experts → combine, `out[t] = Σ_k gate_k · expert_k(x_t)`.
//!
//! Everything one microbatch's backward needs is kept in [`DeviceTensor`]s listed by
//! `saved_activations_mut` (pipeline stages swap them per microbatch): the router logits
//! `(N, E)`, the top-k ids/gates/kept mask `(N, k)`, the aux/z-loss gradient `(N, E)`, the
//! dispatch permutation and splits, and the experts' activations (see `ExpertSaved`).
//! Aux and z losses enter the gradient only (scaled by `1/num_microbatches` like the LM loss)
//! and are reported through `take_metrics`, with the tokens each expert processed.

use crate::config::MoeConfig;
use crate::dispatch::{expert_grid, gather_rows, regroup, scatter_rows, EpGroup};
use crate::experts::{ExpertSaved, Experts};
use crate::init::normal_param;
use crate::router::{self, Score};
use crate::shared::SharedExpert;
use anyhow::{bail, Result};
use megatron_core::{
    Backend, DType, DeviceTensor, GemmSpec, HostBuffer, MlpEnv, MlpModule, MlpStep, ParallelContext, Param,
    ParamLayout, ReduceOp,
};
use std::collections::BTreeMap;
use std::sync::Arc;

// The dispatchers' forward halves (alltoall, allgather) live in a child module so they can
// use this module's private state.
#[path = "layer_dispatch.rs"]
mod layer_dispatch;
#[path = "layer_route.rs"]
mod layer_route;

struct Saved {
    logits: DeviceTensor,      // (N, E)
    idx: DeviceTensor,         // (N, k) i32: selected experts
    gate: DeviceTensor,        // (N, k): gate weights (before dropping)
    kept: DeviceTensor,        // (N, k): 1 kept, 0 dropped by capacity
    aux_dlogits: DeviceTensor, // (N, E): aux + z-loss gradient of the logits
    perm: DeviceTensor,        // (M) i32: assignment id `t·k + slot` of every dispatched row
    splits: DeviceTensor,      // (2·ep) i32: alltoall send splits, then recv splits
    order: DeviceTensor,       // (M_recv) i32: regrouping of the received rows by local expert
    sizes: DeviceTensor,       // (E_local) i32: rows per local expert before capacity padding
    etp_sizes: DeviceTensor,   // (etp·E_local) i32: rows per (expert-TP member, local expert)
    experts: ExpertSaved,
}

pub struct MoeLayer {
    backend: Arc<dyn Backend>,
    ctx: ParallelContext,
    cfg: MoeConfig,
    score: Score,
    layer: usize,
    hidden: usize,
    ep: EpGroup,
    /// Expert-TP group: every expert's fc1 columns / fc2 rows are split over it.
    etp: EpGroup,
    /// The TP group when the expert grid spans TP ranks (tokens split over it), else `None`.
    tp: Option<EpGroup>,
    /// Experts per EP rank.
    local: usize,
    /// Sequence parallelism: the input `(N/tp, C)` is this TP rank's shard of the tokens.
    sp: bool,
    /// `{prefix}.router.weight` `(E, C)`.
    pub router: Param,
    pub experts: Experts,
    /// `--moe-shared-expert-intermediate-size`: added to the routed output.
    pub shared: Option<SharedExpert>,
    /// Aux-loss-free balancing bias `(E)` (selection only), updated once per step; a
    /// checkpointed buffer `{prefix}.router.expert_bias` when `--moe-router-enable-expert-bias`.
    pub expert_bias: Param,
    /// Tokens routed per expert in this step's microbatches (bias update).
    step_counts: Vec<f64>,
    /// `global_aux_loss`: DP-reduced counts accumulated over this step's microbatches.
    global_counts: Vec<f64>,
    global_microbatches: usize,
    /// A full-recomputation forward ([`MlpModule::set_recomputing`]): counts nothing again.
    recomputing: bool,
    /// `global_aux_loss` averages the first forwards used, by microbatch seed (cleared per step).
    global_used: BTreeMap<u64, Vec<f64>>,
    /// Metric name → (sum, count) since the last `take_metrics`.
    metrics: BTreeMap<String, (f64, f64)>,
    /// The last training forward's (aux loss, z-loss) values (tests).
    pub last_losses: (f64, f64),
    saved: Saved,
}

impl MoeLayer {
    pub fn new(cfg: MoeConfig, env: &MlpEnv) -> Result<MoeLayer> {
        cfg.validate()?;
        let backend = env.backend.clone();
        let (e, ep, etp) = (cfg.num_experts, cfg.expert_model_parallel_size, cfg.expert_tensor_parallel_size);
        let grid = expert_grid(&env.ctx, ep, etp)?;
        let group = EpGroup::of(&grid, grid.ep_group.clone(), backend.clone());
        let etp_group = EpGroup::of(&grid, grid.etp_group.clone(), backend.clone());
        // The expert grid spans TP ranks: each TP rank dispatches its share of the tokens (with
        // sequence parallelism the slot's input already is that share).
        let sp = env.sequence_parallel && env.ctx.tp_size() > 1;
        let tp = (grid.experts_sharded() && grid.tp_size() > 1 && !sp)
            .then(|| EpGroup::of(&grid, grid.tp_group.clone(), backend.clone()));
        let local = e / ep;
        let ffn = cfg.moe_ffn_hidden_size.unwrap_or(env.ffn_hidden_size);
        if ffn == 0 || !ffn.is_multiple_of(etp) {
            bail!("--moe-ffn-hidden-size {ffn} must be >= 1 and divisible by --expert-tensor-parallel-size {etp}");
        }
        let router = normal_param(
            backend.as_ref(),
            &format!("{}.router.weight", env.prefix),
            &[e, env.hidden_size],
            env.init_method_std,
            env.seed,
        )?;
        let experts = Experts::new(
            backend.clone(),
            &env.prefix,
            (group.rank * local, local),
            (env.hidden_size, ffn),
            (etp_group.rank, etp),
            env.swiglu,
            cfg.moe_grouped_gemm,
            (env.init_method_std, env.output_init_std, env.seed),
        )?;
        let shared = match cfg.moe_shared_expert_intermediate_size {
            Some(f) => Some(SharedExpert::new(
                backend.clone(),
                &env.prefix,
                (env.hidden_size, f),
                env.swiglu,
                cfg.moe_shared_expert_gate,
                (env.init_method_std, env.output_init_std, env.seed),
            )?),
            None => None,
        };
        let bk = backend.as_ref();
        let z = || bk.zeros(&[0], DType::F32);
        let zi = || bk.zeros(&[0], DType::I32);
        let saved = Saved {
            logits: z()?,
            idx: zi()?,
            gate: z()?,
            kept: z()?,
            aux_dlogits: z()?,
            perm: zi()?,
            splits: zi()?,
            order: zi()?,
            sizes: zi()?,
            etp_sizes: zi()?,
            experts: ExpertSaved::empty(bk)?,
        };
        Ok(MoeLayer {
            score: Score::of(&cfg),
            sp,
            layer: env.layer_number,
            hidden: env.hidden_size,
            ctx: env.ctx.clone(),
            ep: group,
            etp: etp_group,
            tp,
            local,
            router,
            experts,
            shared,
            expert_bias: Param {
                name: format!("{}.router.expert_bias", env.prefix),
                value: bk.zeros(&[e], DType::F32)?,
                grad: bk.zeros(&[0], DType::F32)?,
                layout: ParamLayout::replicated(&[e], true),
            },
            step_counts: vec![0.0; e],
            global_counts: vec![0.0; e],
            global_microbatches: 0,
            recomputing: false,
            global_used: BTreeMap::new(),
            metrics: BTreeMap::new(),
            last_losses: (0.0, 0.0),
            saved,
            cfg,
            backend,
        })
    }

    fn i32_tensor(&self, v: &[usize]) -> Result<DeviceTensor> {
        self.backend.from_host(HostBuffer::I32(v.iter().map(|&x| x as i32).collect()), &[v.len()])
    }

    /// Kept assignments `t·k + slot` ordered by (expert, token, slot).
    fn sorted_assignments(idx: &[i32], kept: &[f32], keep: impl Fn(i32) -> bool) -> Vec<usize> {
        let mut a: Vec<usize> = (0..idx.len()).filter(|&a| kept[a] != 0.0 && keep(idx[a])).collect();
        a.sort_by_key(|&a| (idx[a], a));
        a
    }

    /// Pads every local expert's rows to the capacity (zero rows, zero gate) when asked; at
    /// least the largest group (an expert receives rows from several EP/expert-TP ranks).
    fn padded(&self, n_tokens: usize, sizes: &[usize]) -> Option<usize> {
        let (e, k) = (self.cfg.num_experts, self.cfg.moe_router_topk);
        let most = sizes.iter().copied().max().unwrap_or(0);
        match (self.cfg.moe_pad_expert_input_to_capacity, self.cfg.moe_expert_capacity_factor) {
            (true, Some(cf)) => Some((((n_tokens * k) as f64 / e as f64 * cf as f64).ceil() as usize).max(most)),
            _ => None,
        }
    }

    /// Experts on rows `[x | gate]` grouped by local expert (`sizes`); with expert TP the rows
    /// of the whole expert-TP group are computed on this member's weight slices and the
    /// partial outputs summed back (see the module doc of `dispatch`). Returns `Z (M, C)`.
    fn run_experts(&mut self, rows: &[f32], sizes: &[usize], n: usize) -> Result<Vec<f32>> {
        if self.etp.size == 1 {
            return self.run_local_experts(rows, sizes, n);
        }
        let c = self.hidden;
        let all: Vec<f32> = self.etp.all_gather(sizes.iter().map(|&v| v as f32).collect(), self.local)?;
        let all: Vec<usize> = all.iter().map(|&v| v as usize).collect();
        let m: Vec<usize> = all.chunks(self.local).map(|ch| ch.iter().sum()).collect();
        let gathered = self.etp.all_gather_v(rows.to_vec(), c + 1, &m)?;
        let (order, group_sizes) = regroup(&all, self.etp.size, self.local);
        let z = self.run_local_experts(&gather_rows(&gathered, c + 1, &order), &group_sizes, n)?;
        self.saved.etp_sizes = self.i32_tensor(&all)?;
        self.etp.reduce_scatter_v(scatter_rows(&z, c, &order), c, &m)
    }

    /// Backward of [`Self::run_experts`]: `dz (M, C)` of this member's rows → rows `[dx | dgate]`.
    fn backward_experts(&mut self, dz: &[f32], sizes: &[usize], n: usize) -> Result<Vec<f32>> {
        if self.etp.size == 1 {
            return self.backward_local_experts(dz, sizes, n);
        }
        let c = self.hidden;
        let all: Vec<usize> = self.saved.etp_sizes.host_i32()?.iter().map(|&v| v as usize).collect();
        let m: Vec<usize> = all.chunks(self.local).map(|ch| ch.iter().sum()).collect();
        let gathered = self.etp.all_gather_v(dz.to_vec(), c, &m)?;
        let (order, group_sizes) = regroup(&all, self.etp.size, self.local);
        let rows = self.backward_local_experts(&gather_rows(&gathered, c, &order), &group_sizes, n)?;
        self.etp.reduce_scatter_v(scatter_rows(&rows, c + 1, &order), c + 1, &m)
    }

    /// Experts on rows `[x | gate]` grouped by local expert (`sizes`), optionally padded to
    /// capacity; returns `Z (M, C)` for the unpadded rows.
    fn run_local_experts(&mut self, rows: &[f32], sizes: &[usize], n: usize) -> Result<Vec<f32>> {
        let c = self.hidden;
        self.saved.sizes = self.i32_tensor(sizes)?;
        let (mut x, mut w): (Vec<f32>, Vec<f32>) = (Vec::new(), Vec::new());
        for r in rows.chunks(c + 1) {
            x.extend_from_slice(&r[..c]);
            w.push(r[c]);
        }
        let Some(cap) = self.padded(n, sizes) else {
            let m = w.len();
            let xt = self.backend.from_host(HostBuffer::F32(x), &[m, c])?;
            return self.experts.forward(xt, w, sizes, &mut self.saved.experts);
        };
        // Static shapes: every expert gets exactly `cap` rows (≥ its tokens by construction).
        let (mut px, mut pw, mut start) = (Vec::new(), Vec::new(), 0);
        for &s in sizes {
            px.extend_from_slice(&x[start * c..(start + s) * c]);
            pw.extend_from_slice(&w[start..start + s]);
            px.resize(px.len() + cap.saturating_sub(s) * c, 0.0);
            pw.resize(pw.len() + cap.saturating_sub(s), 0.0);
            start += s;
        }
        let xt = self.backend.from_host(HostBuffer::F32(px), &[cap * sizes.len(), c])?;
        let z = self.experts.forward(xt, pw, &vec![cap; sizes.len()], &mut self.saved.experts)?;
        let mut out = Vec::with_capacity(start * c);
        for (j, &s) in sizes.iter().enumerate() {
            out.extend_from_slice(&z[j * cap * c..(j * cap + s) * c]);
        }
        Ok(out)
    }

    /// Experts' backward for unpadded `dz (M, C)`; returns rows `[dx | dgate]`.
    fn backward_local_experts(&mut self, dz: &[f32], sizes: &[usize], n: usize) -> Result<Vec<f32>> {
        let c = self.hidden;
        let (dx, dw) = match self.padded(n, sizes) {
            None => self.experts.backward(&self.saved.experts, dz)?,
            Some(cap) => {
                let mut pdz = Vec::new();
                let mut start = 0;
                for &s in sizes {
                    pdz.extend_from_slice(&dz[start * c..(start + s) * c]);
                    pdz.resize(pdz.len() + cap.saturating_sub(s) * c, 0.0);
                    start += s;
                }
                let (pdx, pdw) = self.experts.backward(&self.saved.experts, &pdz)?;
                let (mut dx, mut dw) = (Vec::new(), Vec::new());
                for (j, &s) in sizes.iter().enumerate() {
                    dx.extend_from_slice(&pdx[j * cap * c..(j * cap + s) * c]);
                    dw.extend_from_slice(&pdw[j * cap..j * cap + s]);
                }
                (dx, dw)
            }
        };
        Ok(dx.chunks(c.max(1)).zip(&dw).flat_map(|(r, &g)| r.iter().copied().chain(std::iter::once(g))).collect())
    }

    fn counts_from_sizes(&self) -> Result<Vec<usize>> {
        Ok(self.saved.sizes.host_i32()?.iter().map(|&s| s as usize).collect())
    }

    /// This TP rank's tokens `[lo, hi)` of `n` when the experts are sharded over TP ranks
    /// (each TP rank dispatches its equal share, SPEC §5.8; Megatron gets the same from
    /// sequence parallelism), else all of them.
    fn token_range(&self, n: usize) -> Result<(usize, usize)> {
        match &self.tp {
            None => Ok((0, n)),
            Some(tp) => {
                if !n.is_multiple_of(tp.size) {
                    bail!(
                        "the moe plugin splits a micro-batch's {n} tokens over the {} tensor-parallel ranks \
                         (expert grid over TP): use --micro-batch-size x --seq-length divisible by it",
                        tp.size
                    );
                }
                let per = n / tp.size;
                Ok((tp.rank * per, (tp.rank + 1) * per))
            }
        }
    }

    /// Dispatcher backward for this rank's `n` tokens: `dov (n, C)` → `(dx (n, C), dgate (n, k))`.
    fn dispatch_backward(&mut self, dov: &[f32], n: usize) -> Result<(Vec<f32>, Vec<f32>)> {
        let (c, k) = (self.hidden, self.cfg.moe_router_topk);
        let perm: Vec<usize> = self.saved.perm.host_i32()?.iter().map(|&v| v as usize).collect();
        let sizes = self.counts_from_sizes()?;
        let (mut dx, mut dgate) = (vec![0.0f32; n * c], vec![0.0f32; n * k]);
        if self.ep.size > 1 && self.cfg.moe_token_dispatcher_type == "allgather" {
            let d_all = self.ep.all_gather(dov.to_vec(), c)?;
            let dz: Vec<f32> = perm.iter().flat_map(|&a| d_all[(a / k) * c..(a / k + 1) * c].iter().copied()).collect();
            let rows = self.backward_experts(&dz, &sizes, n)?;
            let (mut pdx, mut pdg) = (vec![0.0f32; d_all.len()], vec![0.0f32; self.ep.size * n * k]);
            for (r, &a) in perm.iter().enumerate() {
                let t = a / k;
                let row = &rows[r * (c + 1)..(r + 1) * (c + 1)];
                pdx[t * c..(t + 1) * c].iter_mut().zip(&row[..c]).for_each(|(o, v)| *o += v);
                pdg[a] = row[c];
            }
            dx = self.ep.reduce_scatter(pdx, c)?;
            dgate = self.ep.reduce_scatter(pdg, k)?;
        } else {
            let ep = self.ep.size;
            let splits: Vec<usize> = self.saved.splits.host_i32()?.iter().map(|&v| v as usize).collect();
            let order: Vec<usize> = self.saved.order.host_i32()?.iter().map(|&v| v as usize).collect();
            let (send, recv) = splits.split_at(ep);
            let dz_send: Vec<f32> =
                perm.iter().flat_map(|&a| dov[(a / k) * c..(a / k + 1) * c].iter().copied()).collect();
            let dz_recv = if ep > 1 { self.ep.all_to_all(dz_send, c, send, recv)? } else { dz_send };
            let dz = gather_rows(&dz_recv, c, &order);
            let rows = self.backward_experts(&dz, &sizes, n)?;
            let rows = scatter_rows(&rows, c + 1, &order);
            let rows = if ep > 1 { self.ep.all_to_all(rows, c + 1, recv, send)? } else { rows };
            for (r, &a) in perm.iter().enumerate() {
                let t = a / k;
                let row = &rows[r * (c + 1)..(r + 1) * (c + 1)];
                dx[t * c..(t + 1) * c].iter_mut().zip(&row[..c]).for_each(|(o, v)| *o += v);
                dgate[a] = row[c];
            }
        }
        Ok((dx, dgate))
    }
}

impl MlpModule for MoeLayer {
    fn forward(&mut self, x: &DeviceTensor, out: &mut DeviceTensor, step: MlpStep) -> Result<()> {
        let c = self.hidden;
        let n = x.numel() / c;
        let (idx, gate, kept) = self.route(x, n, step)?;
        let xv = x.host_f32()?;
        // Routing ran on all `n` tokens (the same on every TP rank); the experts see this TP
        // rank's share of them only when the expert grid spans TP ranks.
        let (lo, hi) = self.token_range(n)?;
        let (xs, k) = (&xv[lo * c..hi * c], self.cfg.moe_router_topk);
        let (is, gs, ks) = (&idx[lo * k..hi * k], &gate[lo * k..hi * k], &kept[lo * k..hi * k]);
        let o = if self.ep.size > 1 && self.cfg.moe_token_dispatcher_type == "allgather" {
            self.forward_allgather(xs, is, gs, ks, hi - lo)?
        } else {
            self.forward_alltoall(xs, is, gs, ks, hi - lo)?
        };
        let mut o = match &self.tp {
            Some(tp) => tp.all_gather(o, c)?,
            None => o,
        };
        if let Some(shared) = self.shared.as_mut() {
            o.iter_mut().zip(shared.forward(xv)?).for_each(|(a, b)| *a += b);
        }
        if out.shape() != x.shape() || out.dtype() != DType::F32 {
            *out = self.backend.zeros(x.shape(), DType::F32)?;
        }
        out.host_f32_mut()?.copy_from_slice(&o);
        Ok(())
    }

    fn backward(&mut self, x: &DeviceTensor, d_out: &DeviceTensor, d_x: &mut DeviceTensor) -> Result<()> {
        let (c, e, k) = (self.hidden, self.cfg.num_experts, self.cfg.moe_router_topk);
        let n = x.numel() / c;
        let dov = d_out.host_f32()?.to_vec();
        // The experts' share (this TP rank's tokens), then all tokens' dx and gate gradients.
        let (lo, hi) = self.token_range(n)?;
        let (dx, dgate) = self.dispatch_backward(&dov[lo * c..hi * c], hi - lo)?;
        let (mut dx, dgate) = match &self.tp {
            Some(tp) => (tp.all_gather(dx, c)?, tp.all_gather(dgate, k)?),
            None => (dx, dgate),
        };
        if let Some(shared) = self.shared.as_mut() {
            shared.backward(x.host_f32()?, &dov, &mut dx)?;
        }
        // Router: gate gradient → logits (+ aux/z-loss gradient) → x and the router weight.
        let lv = self.saved.logits.host_f32()?;
        let idx = self.saved.idx.host_i32()?;
        let scale = self.cfg.moe_router_topk_scaling_factor.unwrap_or(1.0);
        let mut dl = router::select_backward(self.score, lv, e, idx, &dgate, scale);
        dl.iter_mut().zip(self.saved.aux_dlogits.host_f32()?).for_each(|(a, b)| *a += b);
        let bk = self.backend.as_ref();
        let dl = bk.from_host(HostBuffer::F32(dl), &[n, e])?;
        if d_x.shape() != x.shape() || d_x.dtype() != DType::F32 {
            *d_x = bk.zeros(x.shape(), DType::F32)?;
        }
        d_x.host_f32_mut()?.copy_from_slice(&dx);
        let add = GemmSpec { m: n, n: c, k: e, trans_a: false, trans_b: false, alpha: 1.0, beta: 1.0 };
        bk.gemm(&dl, &self.router.value, d_x, add, None)?;
        let dw = GemmSpec { m: e, n: c, k: n, trans_a: true, trans_b: false, alpha: 1.0, beta: 1.0 };
        bk.gemm(&dl, x, &mut self.router.grad, dw, None)
    }

    fn saved_activations_mut(&mut self) -> Vec<&mut DeviceTensor> {
        let s = &mut self.saved;
        let mut v = vec![
            &mut s.logits,
            &mut s.idx,
            &mut s.gate,
            &mut s.kept,
            &mut s.aux_dlogits,
            &mut s.perm,
            &mut s.splits,
            &mut s.order,
            &mut s.sizes,
            &mut s.etp_sizes,
        ];
        v.extend(s.experts.tensors_mut());
        if let Some(shared) = self.shared.as_mut() {
            v.extend(shared.tensors_mut());
        }
        v
    }

    fn params(&self) -> Vec<&Param> {
        let mut p = vec![&self.router];
        p.extend(self.experts.fc1.iter().zip(&self.experts.fc2).flat_map(|(a, b)| [a, b]));
        if let Some(shared) = &self.shared {
            p.extend(shared.params());
        }
        p
    }

    fn params_mut(&mut self) -> Vec<&mut Param> {
        let mut p = vec![&mut self.router];
        p.extend(self.experts.fc1.iter_mut().zip(self.experts.fc2.iter_mut()).flat_map(|(a, b)| [a, b]));
        if let Some(shared) = self.shared.as_mut() {
            p.extend(shared.params_mut());
        }
        p
    }

    /// Expert-bias update (aux-loss-free balancing): token counts reduced over the DP group,
    /// `bias_i += rate · sign(mean − n_i)`; and the reset of the global aux-loss counts.
    fn finalize_grads(&mut self) -> Result<()> {
        if self.cfg.moe_router_enable_expert_bias {
            // Over DP and CP: every rank of a model replica sees the same counts, so the bias
            // stays identical on all of them.
            let counts = std::mem::take(&mut self.step_counts);
            let mut counts = self.sum_over_token_group(counts)?;
            self.ctx.comm.all_reduce_f64(&self.ctx.dp_group, &mut counts, ReduceOp::Sum)?;
            let mean = counts.iter().sum::<f64>() / counts.len() as f64;
            let rate = self.cfg.moe_router_bias_update_rate;
            for (b, &n) in self.expert_bias.value.host_f32_mut()?.iter_mut().zip(&counts) {
                *b += rate * (mean - n).signum() as f32 * if mean == n { 0.0 } else { 1.0 };
            }
        }
        self.step_counts = vec![0.0; self.cfg.num_experts];
        self.global_counts = vec![0.0; self.cfg.num_experts];
        self.global_microbatches = 0;
        self.global_used.clear();
        Ok(())
    }

    fn set_recomputing(&mut self, recomputing: bool) -> Result<()> {
        self.recomputing = recomputing;
        Ok(())
    }

    fn buffers(&self) -> Vec<&Param> {
        if self.cfg.moe_router_enable_expert_bias {
            vec![&self.expert_bias]
        } else {
            Vec::new()
        }
    }

    fn buffers_mut(&mut self) -> Vec<&mut Param> {
        if self.cfg.moe_router_enable_expert_bias {
            vec![&mut self.expert_bias]
        } else {
            Vec::new()
        }
    }

    fn take_metrics(&mut self) -> Vec<(String, f64)> {
        std::mem::take(&mut self.metrics).into_iter().map(|(k, (s, n))| (k, s / n.max(1.0))).collect()
    }
}

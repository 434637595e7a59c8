//! The router half of [`MoeLayer`]'s forward: logits, top-k selection (with the expert bias
//! and group limits), capacity dropping, the aux and z losses with their gradient (shared out
//! over the ranks that hold parts of the same sequences), and the per-layer metrics.

use super::MoeLayer;
use crate::router;
use anyhow::Result;
use megatron_core::{DType, DeviceTensor, GemmSpec, HostBuffer, MlpStep, ReduceOp};

impl MoeLayer {
    /// `v` summed over the ranks that hold parts of the same sequences: the context-parallel
    /// group and, with sequence parallelism, the tensor-parallel group (`v` itself without).
    pub(super) fn sum_over_token_group(&self, mut v: Vec<f64>) -> Result<Vec<f64>> {
        if self.ctx.grid.cp > 1 {
            self.ctx.comm.all_reduce_f64(&self.ctx.cp_group, &mut v, ReduceOp::Sum)?;
        }
        if self.sp {
            self.ctx.comm.all_reduce_f64(&self.ctx.tp_group, &mut v, ReduceOp::Sum)?;
        }
        Ok(v)
    }

    fn record(&mut self, name: String, value: f64) {
        let m = self.metrics.entry(name).or_insert((0.0, 0.0));
        m.0 += value;
        m.1 += 1.0;
    }

    /// Router: logits, selection, dropping, aux/z losses. Returns `(idx, gate, kept)`.
    pub(super) fn route(
        &mut self,
        x: &DeviceTensor,
        n: usize,
        step: MlpStep,
    ) -> Result<(Vec<i32>, Vec<f32>, Vec<f32>)> {
        let (e, k, c) = (self.cfg.num_experts, self.cfg.moe_router_topk, self.hidden);
        let bk = self.backend.clone();
        let mut logits = bk.zeros(&[n, e], DType::F32)?;
        bk.gemm(x, &self.router.value, &mut logits, GemmSpec::linear(n, e, c), None)?;
        let lv = logits.host_f32()?.to_vec();
        let scale = self.cfg.moe_router_topk_scaling_factor.unwrap_or(1.0);
        let groups = self.cfg.moe_router_num_groups.zip(self.cfg.moe_router_group_topk);
        let bias = self.expert_bias.value.host_f32()?;
        let (idx, gate) = router::select(self.score, &lv, e, k, bias, scale, groups);
        let counts = router::counts(&idx, e, k, n);
        let kept = match self.cfg.moe_expert_capacity_factor {
            Some(cf) => {
                let cap = ((n * k) as f64 / e as f64 * cf as f64).ceil() as usize;
                router::capacity_mask(&idx, &gate, e, cap, self.cfg.moe_token_drop_policy == "probs")
            }
            None => vec![1.0; n * k],
        };
        let mut aux_d = vec![0.0f32; n * e];
        if step.train {
            let g = 1.0 / self.cfg.num_microbatches as f32;
            // Tokens spread over ranks: with context parallelism this rank holds 1/cp of every
            // sequence, with sequence parallelism 1/tp of the flattened (B, T) rows. The aux
            // losses count tokens over the whole sequences (counts summed over the CP and SP
            // groups, totals × cp·sp) and each rank adds its own tokens' share of the loss, so
            // the shares sum to the single-rank loss. The gradient reduction averages over
            // dp·cp but sums the SP group's replicated gradients, so the shares' gradients are
            // scaled by cp; the z-loss, a mean over tokens, is already a CP rank's share and
            // is divided by sp for an SP rank's.
            let (cp, sp) = (self.ctx.grid.cp, if self.sp { self.ctx.tp_size() } else { 1 });
            let g_aux = g * cp as f32;
            let coeff = self.cfg.moe_aux_loss_coeff;
            let kind = self.cfg.moe_router_load_balancing_type.clone();
            let aux = match kind.as_str() {
                "aux_loss" if coeff > 0.0 => {
                    let whole = self.sum_over_token_group(counts.clone())?;
                    let (ch, t) = (router::Chunks::local(n, n), (n * cp * sp) as f64);
                    router::switch_aux_loss(self.score, &lv, e, k, ch, &whole, t, coeff, g_aux, &mut aux_d)
                }
                "seq_aux_loss" if coeff > 0.0 => {
                    // A rank's rows are consecutive in the flattened (B, T_cp) of its CP shard.
                    let rank = if self.sp { self.ctx.tp_rank } else { 0 };
                    let ch = router::Chunks { rows: step.seq, offset: rank * n, chunks: step.batch };
                    let per_seq = self.sum_over_token_group(router::counts_in(&idx, e, k, ch))?;
                    let t = (step.seq * cp) as f64;
                    router::switch_aux_loss(self.score, &lv, e, k, ch, &per_seq, t, coeff, g_aux, &mut aux_d)
                }
                "global_aux_loss" if coeff > 0.0 => {
                    let avg = if self.recomputing {
                        // The average the first forward of this microbatch used (the DP
                        // all-reduce is skipped on every rank alike: all recompute here).
                        self.global_used.remove(&step.seed).ok_or_else(|| {
                            anyhow::anyhow!(
                                "MoE layer {}: recomputed forward of a microbatch (seed {}) whose first \
                                 training forward was not run in this step",
                                self.layer,
                                step.seed
                            )
                        })?
                    } else {
                        let mut global = self.sum_over_token_group(counts.clone())?;
                        self.ctx.comm.all_reduce_f64(&self.ctx.dp_group, &mut global, ReduceOp::Sum)?;
                        self.global_counts.iter_mut().zip(&global).for_each(|(a, b)| *a += b);
                        self.global_microbatches += 1;
                        let avg: Vec<f64> =
                            self.global_counts.iter().map(|v| v / self.global_microbatches as f64).collect();
                        self.global_used.insert(step.seed, avg.clone());
                        avg
                    };
                    let t = (n * self.ctx.dp_size() * cp * sp) as f64;
                    let ch = router::Chunks::local(n, n);
                    router::switch_aux_loss(self.score, &lv, e, k, ch, &avg, t, coeff, g_aux, &mut aux_d)
                }
                _ => 0.0,
            };
            let z = match self.cfg.moe_z_loss_coeff {
                Some(cz) if cz > 0.0 => router::z_loss(&lv, e, cz / sp as f32, g, &mut aux_d),
                _ => 0.0,
            };
            if self.recomputing {
                // Everything below is counting: done once, by the first forward.
                return self.save_routing(logits, idx, gate, kept, aux_d);
            }
            // Logged: the whole losses (the shares added up; the CP ranks' z means averaged).
            let (aux, z) = if cp * sp > 1 {
                let v = self.sum_over_token_group(vec![aux, z])?;
                (v[0], v[1] / cp as f64)
            } else {
                (aux, z)
            };
            self.last_losses = (aux, z);
            if kind != "none" && coeff > 0.0 {
                let name = match kind.as_str() {
                    "seq_aux_loss" => "seq_load_balancing_loss",
                    "global_aux_loss" => "global_load_balancing_loss",
                    _ => "load_balancing_loss",
                };
                self.record(name.into(), aux);
            }
            if self.cfg.moe_z_loss_coeff.is_some() {
                self.record("z_loss".into(), z);
            }
            self.step_counts.iter_mut().zip(&counts).for_each(|(a, b)| *a += b);
            // Tokens each expert processes (after dropping), over this rank's tokens.
            let mut load = vec![0.0f64; e];
            for (a, &j) in idx.iter().enumerate() {
                load[j as usize] += kept[a] as f64;
            }
            let (min, max) = load.iter().fold((f64::INFINITY, 0.0f64), |(lo, hi), &v| (lo.min(v), hi.max(v)));
            let mean = (n * k) as f64 / e as f64;
            let l = self.layer;
            self.record(format!("expert_load_min/layer{l}"), min);
            self.record(format!("expert_load_max/layer{l}"), max);
            self.record(format!("expert_load_imbalance/layer{l}"), max / mean.max(1e-12));
            if self.cfg.moe_expert_capacity_factor.is_some() {
                let dropped = kept.iter().filter(|&&v| v == 0.0).count();
                self.record(format!("dropped_token_fraction/layer{l}"), dropped as f64 / (n * k) as f64);
            }
        }
        self.save_routing(logits, idx, gate, kept, aux_d)
    }

    /// Keeps the routing for backward (`(N, E)` logits and aux gradient, `(N, k)` ids, gates and
    /// kept mask) and returns `(idx, gate, kept)`.
    fn save_routing(
        &mut self,
        logits: DeviceTensor,
        idx: Vec<i32>,
        gate: Vec<f32>,
        kept: Vec<f32>,
        aux_d: Vec<f32>,
    ) -> Result<(Vec<i32>, Vec<f32>, Vec<f32>)> {
        let (e, k) = (self.cfg.num_experts, self.cfg.moe_router_topk);
        let n = idx.len() / k.max(1);
        let bk = self.backend.as_ref();
        self.saved.logits = logits;
        self.saved.idx = bk.from_host(HostBuffer::I32(idx.clone()), &[n, k])?;
        self.saved.gate = bk.from_host(HostBuffer::F32(gate.clone()), &[n, k])?;
        self.saved.kept = bk.from_host(HostBuffer::F32(kept.clone()), &[n, k])?;
        self.saved.aux_dlogits = bk.from_host(HostBuffer::F32(aux_d), &[n, e])?;
        Ok((idx, gate, kept))
    }
}

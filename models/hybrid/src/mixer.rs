//! The Mamba-2 mixer (Megatron-Core `MambaMixer`, SPEC §4.15.1) with explicit forward and
//! backward:
//! `in_proj` → split `[z (Di) | xBC (Di + 2GN) | dt (H)]` → causal conv1d + SiLU on xBC →
//! split `[x (H, P) | B (G, N) | C (G, N)]` → `Δ = softplus(dt + dt_bias)`, `A = −exp(A_log)` →
//! SSD chunked scan with D skip → gated RMSNorm `norm(y ⊙ silu(z))` per group → `out_proj`.
//! No in/out-proj bias, conv bias on (as Megatron).
//!
//! Tensor parallelism (Megatron-Core's split): heads and groups are divided over the TP ranks.
//! `in_proj` is column-parallel with every component split on its own (a rank holds
//! `[z_r | x_r | B_r | C_r | dt_r]`, the [`ParamLayout::tp_blocks`] of the parameter), the conv
//! weight and bias likewise (`[x_r | B_r | C_r]`), `dt_bias`, `A_log`, `D` and the gated norm
//! weight by heads (the norm works per group, and groups never straddle ranks), `out_proj` is
//! row-parallel: its partial outputs are summed over the TP group, and so are the partial
//! input gradients of `in_proj`. Every rank then runs the unchanged local math on `H/tp` heads
//! and `G/tp` groups. Parameters are drawn whole and sliced, so they do not depend on tp.
//!
//! Mixed precision (`--bf16`/`--fp16`): the parameters are in the model's half dtype like
//! every other layer's (fp32 main copies in the optimizer, fp32 gradients), the input, the
//! `out_proj` input and the output are half activations, and the two projections are half GEMMs
//! with f32 accumulation. The conv, the scan and the gated norm run in fp32 inside: their
//! Backend ops get f32 tensors (the small conv/D/norm parameters widened per call, exact), and
//! the tensors they save for backward stay f32; `in_proj`'s output is read on the host in f32.
//!
//! Initialisation as Megatron/mamba_ssm: `in_proj` Normal(0, std), `out_proj` Normal(0,
//! std/√(2L)), conv weight and bias U(±1/√K) (PyTorch's default for a depthwise conv),
//! `dt_bias` = inverse softplus of Δ = exp(U(log 1e-3, log 0.1)) floored at 1e-4,
//! `A_log = log U(1, 16)`, `D = 1`, norm weight 1.

use crate::ops::conv::ConvDims;
use crate::ops::dt::{a_from_log, a_log_backward, inverse_softplus, softplus_dt_backward, softplus_dt_forward};
use crate::ops::SsdDims;
use anyhow::{bail, Result};
use megatron_core::{
    Backend, DType, DeviceTensor, HostBuffer, ParallelContext, Param, ParamLayout, SsdGradTensors, SsdTensors,
};
use megatron_transformer::init::{init_global, param_seed};
use megatron_transformer::tp_mappings::{copy_to_tp_region_backward, reduce_from_tp_region_forward};
use megatron_transformer::{linear_backward, linear_forward, Init, ModuleBuilder, Split};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::sync::Arc;

/// Sizes of one mixer (of the whole mixer when given to [`MambaMixer::new`]; a built mixer's
/// `dims` are this rank's: `heads / tp`, `groups / tp`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MixerDims {
    pub hidden: usize,
    pub heads: usize,
    pub head_dim: usize,
    pub groups: usize,
    pub state: usize,
    pub conv: usize,
    pub chunk: usize,
}

impl MixerDims {
    pub fn d_inner(&self) -> usize {
        self.heads * self.head_dim
    }
    /// Channels of the conv (x, B and C).
    pub fn conv_channels(&self) -> usize {
        self.d_inner() + 2 * self.groups * self.state
    }
    /// Width of `in_proj`'s output.
    pub fn in_proj_width(&self) -> usize {
        self.d_inner() + self.conv_channels() + self.heads
    }
}

/// What the forward keeps for backward (`N = B·T`).
#[derive(Default)]
pub(crate) struct Saved {
    batch: usize,
    seq: usize,
    zxbcdt: Vec<f32>, // (N, 2Di + 2GN + H)
    tensors: Option<SavedTensors>,
}

/// The saved backend tensors.
pub(crate) struct SavedTensors {
    xbc_in: DeviceTensor,  // (N, Di + 2GN): conv input
    xbc_pre: DeviceTensor, // (N, Di + 2GN): conv output before SiLU
    x: DeviceTensor,       // (N, H, P): scan input x (after the conv)
    bm: DeviceTensor,      // (N, G, N_state)
    cm: DeviceTensor,      // (N, G, N_state)
    delta: DeviceTensor,   // (N, H)
    z: DeviceTensor,       // (N, Di): gate
    y: DeviceTensor,       // (N, Di): scan output
    rstd: DeviceTensor,    // (N, G)
    states: DeviceTensor,  // (B, H, chunks, N_state, P)
    y_norm: DeviceTensor,  // (N, Di): out_proj input, activation dtype
}

pub struct MambaMixer {
    backend: Arc<dyn Backend>,
    ctx: ParallelContext,
    pub dims: MixerDims,
    eps: f32,
    /// Activation dtype: the `out_proj` input saved for backward (`y_norm`).
    act: DType,
    pub in_proj: Param,     // [2Di + 2GN + H, C]
    pub conv_weight: Param, // [Di + 2GN, 1, K]
    pub conv_bias: Param,   // [Di + 2GN]
    pub dt_bias: Param,     // [H]
    pub a_log: Param,       // [H]
    pub d: Param,           // [H]
    pub norm: Param,        // [Di]
    pub out_proj: Param,    // [C, Di]
    saved: Saved,
}

/// A parameter of global shape `shape` holding the global `values`, whose dim 0 is made of
/// `blocks` (global lengths) each split over the TP ranks on its own (one block: a plain row
/// split). The rank keeps `[block0_r; block1_r; ...]`.
fn blocked_param(b: &ModuleBuilder, name: &str, shape: &[usize], blocks: &[usize], values: Vec<f32>) -> Result<Param> {
    let (tp, rank) = (b.tp_size(), b.tp_rank());
    let row: usize = shape[1..].iter().product();
    if blocks.iter().sum::<usize>() != shape[0] || blocks.iter().any(|n| !n.is_multiple_of(tp)) {
        bail!("parameter `{name}`: blocks {blocks:?} of dim 0 of {shape:?} cannot be split over {tp} tensor-parallel ranks");
    }
    let (mut local, mut at) = (Vec::with_capacity(values.len() / tp), 0);
    for &n in blocks {
        let start = (at + rank * (n / tp)) * row;
        local.extend_from_slice(&values[start..start + n / tp * row]);
        at += n;
    }
    let mut local_shape = shape.to_vec();
    local_shape[0] /= tp;
    let dtype = b.dtype();
    let layout = ParamLayout {
        tp_axis: Some(0),
        tp_rank: rank,
        tp_size: tp,
        tp_chunks: blocks.len(),
        tp_blocks: if blocks.len() > 1 { blocks.to_vec() } else { Vec::new() },
        ..ParamLayout::replicated(shape, shape.len() == 1)
    };
    let value = widened_to(b.backend.as_ref(), b.backend.from_host(HostBuffer::F32(local), &local_shape)?, dtype)?;
    Ok(Param { name: name.to_string(), value, grad: b.backend.zeros(&local_shape, b.precision.grads)?, layout })
}

/// `t` (f32) rounded once to `dtype` (`t` itself for f32).
fn widened_to(be: &dyn Backend, t: DeviceTensor, dtype: DType) -> Result<DeviceTensor> {
    if t.dtype() == dtype {
        return Ok(t);
    }
    let mut out = be.zeros(t.shape(), dtype)?;
    be.cast(&t, &mut out)?;
    Ok(out)
}

/// An f32 copy of a (half) parameter value, for the fp32 Backend ops of the conv, the scan
/// and the gated norm (exact: widening a half value).
fn f32_of(be: &dyn Backend, t: &DeviceTensor) -> Result<DeviceTensor> {
    let mut out = be.zeros(t.shape(), DType::F32)?;
    if t.dtype() == DType::F32 {
        be.copy(t, &mut out)?;
    } else {
        be.cast(t, &mut out)?;
    }
    Ok(out)
}

fn uniform(b: &ModuleBuilder, name: &str, n: usize, lo: f32, hi: f32) -> Vec<f32> {
    let mut r = ChaCha8Rng::seed_from_u64(param_seed(b.seed, name));
    (0..n).map(|_| r.gen_range(lo..hi)).collect()
}

pub(crate) fn read(be: &dyn Backend, t: &DeviceTensor) -> Result<Vec<f32>> {
    Ok(be.to_host(t)?.to_f32_vec())
}

/// `p.grad += g` (shape of the parameter).
fn accumulate(be: &dyn Backend, p: &mut Param, g: Vec<f32>) -> Result<()> {
    let t = be.from_host(HostBuffer::F32(g), p.grad.shape())?;
    be.axpy(&mut p.grad, 1.0, &t)
}

/// Columns `[from, from + w)` of the `(rows, width)` matrix `m`.
pub(crate) fn cols(m: &[f32], width: usize, from: usize, w: usize) -> Vec<f32> {
    m.chunks(width).flat_map(|r| r[from..from + w].iter().copied()).collect()
}

/// Writes `part (rows, w)` into columns `[from, from + w)` of `m (rows, width)`.
fn put_cols(m: &mut [f32], width: usize, from: usize, part: &[f32], w: usize) {
    for (r, p) in m.chunks_mut(width).zip(part.chunks(w)) {
        r[from..from + w].copy_from_slice(p);
    }
}

impl MambaMixer {
    /// Builds `{prefix}.in_proj.weight`, `conv1d.weight/bias`, `dt_bias`, `A_log`, `D`,
    /// `norm.weight`, `out_proj.weight`; `out_std` is the output-layer init std.
    pub fn new(
        b: &ModuleBuilder,
        prefix: &str,
        dims: MixerDims,
        std: f32,
        out_std: f32,
        eps: f32,
    ) -> Result<MambaMixer> {
        let tp = b.tp_size();
        if !dims.heads.is_multiple_of(tp) || !dims.groups.is_multiple_of(tp) || !dims.heads.is_multiple_of(dims.groups)
        {
            bail!(
                "mamba heads {} and --mamba-num-groups {} must be divisible by --tensor-model-parallel-size {tp} \
                 (and heads by groups)",
                dims.heads,
                dims.groups
            );
        }
        let (c, h, di, ch, k) = (dims.hidden, dims.heads, dims.d_inner(), dims.conv_channels(), dims.conv);
        let gn = dims.groups * dims.state;
        let n = |s: &str| format!("{prefix}.{s}");
        let bound = 1.0 / (k as f32).sqrt();
        let (lo, hi) = (1e-3f32.ln(), 0.1f32.ln());
        let dt: Vec<f32> =
            uniform(b, &n("dt_bias"), h, lo, hi).into_iter().map(|u| inverse_softplus(u.exp().max(1e-4))).collect();
        let a_log: Vec<f32> = uniform(b, &n("A_log"), h, 1.0, 16.0).into_iter().map(f32::ln).collect();
        let width = dims.in_proj_width();
        let in_proj = init_global(Init::Normal(std), width * c, param_seed(b.seed, &n("in_proj.weight")))?;
        let conv_blocks = [di, gn, gn];
        let local = MixerDims { heads: h / tp, groups: dims.groups / tp, ..dims };
        Ok(MambaMixer {
            in_proj: blocked_param(b, &n("in_proj.weight"), &[width, c], &[di, di, gn, gn, h], in_proj)?,
            conv_weight: blocked_param(
                b,
                &n("conv1d.weight"),
                &[ch, 1, k],
                &conv_blocks,
                uniform(b, &n("conv1d.weight"), ch * k, -bound, bound),
            )?,
            conv_bias: blocked_param(
                b,
                &n("conv1d.bias"),
                &[ch],
                &conv_blocks,
                uniform(b, &n("conv1d.bias"), ch, -bound, bound),
            )?,
            dt_bias: blocked_param(b, &n("dt_bias"), &[h], &[h], dt)?,
            a_log: blocked_param(b, &n("A_log"), &[h], &[h], a_log)?,
            d: b.param(&n("D"), &[h], Split::Rows { chunks: 1 }, Init::Ones)?,
            norm: b.param(&n("norm.weight"), &[di], Split::Rows { chunks: 1 }, Init::Ones)?,
            out_proj: b.param(&n("out_proj.weight"), &[c, di], Split::Cols, Init::Normal(out_std))?,
            backend: b.backend.clone(),
            ctx: b.ctx.clone(),
            dims: local,
            eps,
            act: b.dtype(),
            saved: Saved::default(),
        })
    }

    pub(crate) fn backend(&self) -> &dyn Backend {
        self.backend.as_ref()
    }

    /// Moves the last training forward's saved tensors out (pipeline stages keep one set per
    /// microbatch in flight) and back in.
    pub(crate) fn take_saved(&mut self) -> Saved {
        std::mem::take(&mut self.saved)
    }

    pub(crate) fn put_saved(&mut self, saved: Saved) {
        self.saved = saved;
    }

    pub(crate) fn ctx(&self) -> &ParallelContext {
        &self.ctx
    }

    pub(crate) fn eps(&self) -> f32 {
        self.eps
    }

    fn ssd_dims(&self, batch: usize, seq: usize) -> SsdDims {
        let d = self.dims;
        SsdDims { batch, seq, heads: d.heads, head_dim: d.head_dim, groups: d.groups, state: d.state, chunk: d.chunk }
    }

    /// `out (B·T, C)` from `u (B·T, C)` (the normed layer input); keeps what backward needs.
    /// The conv, the scan and the gated norm are Backend ops (fast CPU kernels; the naive
    /// references in [`crate::ops`] are their oracles).
    pub fn forward(&mut self, u: &DeviceTensor, out: &mut DeviceTensor, batch: usize, seq: usize) -> Result<()> {
        let be = self.backend.clone();
        let be = be.as_ref();
        let d = self.dims;
        let (rows, di, ch, h, gn) = (batch * seq, d.d_inner(), d.conv_channels(), d.heads, d.groups * d.state);
        let width = d.in_proj_width();
        let t = |v: Vec<f32>, shape: &[usize]| be.from_host(HostBuffer::F32(v), shape);
        let mut zx = be.zeros(&[rows, width], DType::F32)?;
        linear_forward(be, u, &self.in_proj.value, None, &mut zx)?;
        let zxbcdt = read(be, &zx)?; // (N, 2Di + 2GN + H)
        let conv_dims = ConvDims { batch, seq, channels: ch, width: d.conv };
        let xbc_in = t(cols(&zxbcdt, width, di, ch), &[rows, ch])?;
        let (mut xbc_t, mut xbc_pre) = (be.zeros(&[rows, ch], DType::F32)?, be.zeros(&[rows, ch], DType::F32)?);
        be.causal_conv1d_silu_forward(
            &xbc_in,
            &f32_of(be, &self.conv_weight.value)?,
            &f32_of(be, &self.conv_bias.value)?,
            &mut xbc_t,
            &mut xbc_pre,
            conv_dims,
        )?;
        let xbc = read(be, &xbc_t)?;
        let delta = softplus_dt_forward(&cols(&zxbcdt, width, di + ch, h), &read(be, &self.dt_bias.value)?); // (N, H)
        let a = t(a_from_log(&read(be, &self.a_log.value)?), &[h])?;
        let x = t(cols(&xbc, ch, 0, di), &[rows, di])?;
        let bm = t(cols(&xbc, ch, di, gn), &[rows, gn])?;
        let cm = t(cols(&xbc, ch, di + gn, gn), &[rows, gn])?;
        let delta = t(delta, &[rows, h])?;
        let spec = self.ssd_dims(batch, seq);
        let d_skip = f32_of(be, &self.d.value)?;
        let inputs = SsdTensors { x: &x, dt: &delta, a: &a, b: &bm, c: &cm, d: &d_skip };
        let mut y = be.zeros(&[rows, di], DType::F32)?;
        let mut states = be.zeros(&[spec.states_len()], DType::F32)?;
        be.ssd_scan_forward(inputs, &mut y, &mut states, spec)?;
        let z = t(cols(&zxbcdt, width, 0, di), &[rows, di])?;
        let (mut yn, mut rstd) = (be.zeros(&[rows, di], DType::F32)?, be.zeros(&[rows, d.groups], DType::F32)?);
        be.gated_rmsnorm_forward(&y, &z, &f32_of(be, &self.norm.value)?, d.groups, self.eps, &mut yn, &mut rstd)?;
        let yn = widened_to(be, yn, self.act)?; // the out_proj input, an activation (half)
        linear_forward(be, &yn, &self.out_proj.value, None, out)?;
        reduce_from_tp_region_forward(&self.ctx, out)?; // row-parallel out_proj: sum the partial outputs
        let tensors = SavedTensors { xbc_in, xbc_pre, x, bm, cm, delta, z, y, rstd, states, y_norm: yn };
        self.saved = Saved { batch, seq, zxbcdt, tensors: Some(tensors) };
        Ok(())
    }

    /// Overwrites `d_u (B·T, C)` from `d_out (B·T, C)`; accumulates every parameter gradient.
    pub fn backward(&mut self, u: &DeviceTensor, d_out: &DeviceTensor, d_u: &mut DeviceTensor) -> Result<()> {
        let be = self.backend.clone();
        let be = be.as_ref();
        let s = std::mem::take(&mut self.saved);
        let Some(st) = s.tensors.as_ref() else { bail!("Mamba mixer backward without a forward") };
        let d = self.dims;
        let (rows, di, ch, h, gn) = (s.batch * s.seq, d.d_inner(), d.conv_channels(), d.heads, d.groups * d.state);
        let width = d.in_proj_width();
        let zeros = |shape: &[usize]| be.zeros(shape, DType::F32);
        // out_proj: d_yn (N, Di).
        let mut d_yn = zeros(&[rows, di])?;
        linear_backward(be, &st.y_norm, &self.out_proj.value, d_out, Some(&mut d_yn), &mut self.out_proj.grad, None)?;
        // Gated norm: dy (N, Di), dz (N, Di).
        let (mut dy, mut dz) = (zeros(&[rows, di])?, zeros(&[rows, di])?);
        be.gated_rmsnorm_backward(
            &st.y,
            &st.z,
            &f32_of(be, &self.norm.value)?,
            d.groups,
            &st.rstd,
            &d_yn,
            &mut dy,
            &mut dz,
            &mut self.norm.grad,
        )?;
        // Scan.
        let a_log = read(be, &self.a_log.value)?;
        let a = be.from_host(HostBuffer::F32(a_from_log(&a_log)), &[h])?;
        let d_skip = f32_of(be, &self.d.value)?;
        let inputs = SsdTensors { x: &st.x, dt: &st.delta, a: &a, b: &st.bm, c: &st.cm, d: &d_skip };
        let (mut gx, mut gdt, mut ga) = (zeros(&[rows, di])?, zeros(&[rows, h])?, zeros(&[h])?);
        let (mut gb, mut gc, mut gd) = (zeros(&[rows, gn])?, zeros(&[rows, gn])?, zeros(&[h])?);
        let grads = SsdGradTensors { x: &mut gx, dt: &mut gdt, a: &mut ga, b: &mut gb, c: &mut gc, d: &mut gd };
        be.ssd_scan_backward(inputs, &st.states, &dy, grads, self.ssd_dims(s.batch, s.seq))?;
        accumulate(be, &mut self.a_log, a_log_backward(&a_log, &read(be, &ga)?))?;
        be.axpy(&mut self.d.grad, 1.0, &gd)?;
        let (d_dt, d_dt_bias) = softplus_dt_backward(
            &cols(&s.zxbcdt, width, di + ch, h),
            &read(be, &self.dt_bias.value)?,
            &read(be, &gdt)?,
        );
        accumulate(be, &mut self.dt_bias, d_dt_bias)?;
        // Conv: d xBC after SiLU = [dx | dB | dC].
        let mut d_xbc = vec![0.0f32; rows * ch];
        put_cols(&mut d_xbc, ch, 0, &read(be, &gx)?, di);
        put_cols(&mut d_xbc, ch, di, &read(be, &gb)?, gn);
        put_cols(&mut d_xbc, ch, di + gn, &read(be, &gc)?, gn);
        let d_xbc = be.from_host(HostBuffer::F32(d_xbc), &[rows, ch])?;
        let conv_dims = ConvDims { batch: s.batch, seq: s.seq, channels: ch, width: d.conv };
        let mut d_xbc_in = zeros(&[rows, ch])?;
        be.causal_conv1d_silu_backward(
            &st.xbc_in,
            &f32_of(be, &self.conv_weight.value)?,
            &st.xbc_pre,
            &d_xbc,
            &mut d_xbc_in,
            &mut self.conv_weight.grad,
            &mut self.conv_bias.grad,
            conv_dims,
        )?;
        // in_proj: d zxbcdt (N, width).
        let mut dzx = vec![0.0f32; rows * width];
        put_cols(&mut dzx, width, 0, &read(be, &dz)?, di);
        put_cols(&mut dzx, width, di, &read(be, &d_xbc_in)?, ch);
        put_cols(&mut dzx, width, di + ch, &d_dt, h);
        let dzx = be.from_host(HostBuffer::F32(dzx), &[rows, width])?;
        linear_backward(be, u, &self.in_proj.value, &dzx, Some(d_u), &mut self.in_proj.grad, None)?;
        copy_to_tp_region_backward(&self.ctx, d_u) // column-parallel in_proj: sum the partial input gradients
    }

    pub fn params(&self) -> Vec<&Param> {
        vec![
            &self.in_proj,
            &self.conv_weight,
            &self.conv_bias,
            &self.dt_bias,
            &self.a_log,
            &self.d,
            &self.norm,
            &self.out_proj,
        ]
    }

    pub fn params_mut(&mut self) -> Vec<&mut Param> {
        vec![
            &mut self.in_proj,
            &mut self.conv_weight,
            &mut self.conv_bias,
            &mut self.dt_bias,
            &mut self.a_log,
            &mut self.d,
            &mut self.norm,
            &mut self.out_proj,
        ]
    }
}

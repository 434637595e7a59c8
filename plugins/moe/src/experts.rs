//! The local experts: per expert `y = fc2(act(fc1(x)))` (SwiGLU with fc1 rows `[gate; up]`,
//! or GeLU), no biases (as Megatron's grouped experts and Mixtral). Rows arrive grouped by
//! local expert (`sizes[j]` consecutive rows for expert `j`) and every matmul is ONE
//! [`Backend::grouped_gemm`] call over all experts' row groups (or, with
//! `moe_grouped_gemm = false`, one call per expert — the reference the benchmark measures).
//! Weights stay one [`Param`] per expert with its global id (checkpoints by expert) and are
//! packed into one `(E_local, ·, ·)` buffer per forward (a copy of the weights, small next to
//! the matmuls).

use crate::init::normal_param;
use anyhow::Result;
use megatron_core::{Backend, DType, DeviceTensor, GemmGroup, GroupedGemmSpec, HostBuffer, Param};
use std::sync::Arc;

/// What backward needs from one expert forward (`M` rows).
pub struct ExpertSaved {
    pub x: DeviceTensor,     // (M, C)
    pub w: DeviceTensor,     // (M): the gate weight of every row
    pub h1: DeviceTensor,    // (M, F) or (M, 2F) gated
    pub act: DeviceTensor,   // (M, F)
    pub y: DeviceTensor,     // (M, C): unweighted expert outputs
    pub sizes: DeviceTensor, // (E_local) i32: rows per local expert
}

impl ExpertSaved {
    pub fn empty(b: &dyn Backend) -> Result<ExpertSaved> {
        let z = || b.zeros(&[0], DType::F32);
        Ok(ExpertSaved { x: z()?, w: z()?, h1: z()?, act: z()?, y: z()?, sizes: b.zeros(&[0], DType::I32)? })
    }

    pub fn tensors_mut(&mut self) -> Vec<&mut DeviceTensor> {
        vec![&mut self.x, &mut self.w, &mut self.h1, &mut self.act, &mut self.y, &mut self.sizes]
    }
}

pub struct Experts {
    backend: Arc<dyn Backend>,
    hidden: usize,
    ffn: usize,
    swiglu: bool,
    grouped: bool,
    /// `{prefix}.experts.local_experts.{global id}.linear_fc1.weight` `(2F or F, C)`.
    pub fc1: Vec<Param>,
    /// `{prefix}.experts.local_experts.{global id}.linear_fc2.weight` `(C, F)`.
    pub fc2: Vec<Param>,
}

#[allow(clippy::too_many_arguments)]
impl Experts {
    /// Experts `first..first + count` (global ids) of the layer `prefix`, expert-TP slice
    /// `etp_rank` of `etp`: fc1's output rows (each of SwiGLU's [gate; up] blocks on its own)
    /// and fc2's input columns, `ffn / etp` of them (Megatron's column-/row-parallel experts).
    /// Each weight is drawn whole and sliced, so values do not depend on the layout.
    pub fn new(
        backend: Arc<dyn Backend>,
        prefix: &str,
        (first, count): (usize, usize),
        (hidden, ffn): (usize, usize),
        (etp_rank, etp): (usize, usize),
        swiglu: bool,
        grouped: bool,
        (std, out_std, seed): (f32, f32, u64),
    ) -> Result<Experts> {
        let gates = if swiglu { 2 } else { 1 };
        let local_ffn = ffn / etp;
        let (mut fc1, mut fc2) = (Vec::new(), Vec::new());
        for e in first..first + count {
            let p = format!("{prefix}.experts.local_experts.{e}");
            let w1 =
                normal_param(backend.as_ref(), &format!("{p}.linear_fc1.weight"), &[gates * ffn, hidden], std, seed)?;
            let w2 = normal_param(backend.as_ref(), &format!("{p}.linear_fc2.weight"), &[hidden, ffn], out_std, seed)?;
            fc1.push(split_param(backend.as_ref(), w1, 0, gates, (etp_rank, etp))?);
            fc2.push(split_param(backend.as_ref(), w2, 1, 1, (etp_rank, etp))?);
        }
        // Only this expert-parallel rank holds these experts (SPEC §5.8).
        for p in fc1.iter_mut().chain(fc2.iter_mut()) {
            p.layout.expert_parallel = true;
        }
        Ok(Experts { backend, hidden, ffn: local_ffn, swiglu, grouped, fc1, fc2 })
    }

    /// The shared expert (SPEC §4.12 `--moe-shared-expert-intermediate-size`): one MLP of width
    /// `ffn` that every token goes through, `{prefix}.shared_experts.linear_fc{1,2}.weight`,
    /// replicated like a dense MLP (not expert-parallel).
    pub fn shared(
        backend: Arc<dyn Backend>,
        prefix: &str,
        (hidden, ffn): (usize, usize),
        swiglu: bool,
        (std, out_std, seed): (f32, f32, u64),
    ) -> Result<Experts> {
        let gates = if swiglu { 2 } else { 1 };
        let p = format!("{prefix}.shared_experts");
        let bk = backend.as_ref();
        let fc1 = vec![normal_param(bk, &format!("{p}.linear_fc1.weight"), &[gates * ffn, hidden], std, seed)?];
        let fc2 = vec![normal_param(bk, &format!("{p}.linear_fc2.weight"), &[hidden, ffn], out_std, seed)?];
        Ok(Experts { backend, hidden, ffn, swiglu, grouped: true, fc1, fc2 })
    }

    fn fc1_width(&self) -> usize {
        if self.swiglu {
            2 * self.ffn
        } else {
            self.ffn
        }
    }

    /// The local experts' weights (or gradients) back to back.
    fn pack(&self, params: &[Param], grad: bool) -> Result<DeviceTensor> {
        let mut v = Vec::new();
        for p in params {
            v.extend_from_slice(if grad { p.grad.host_f32()? } else { p.value.host_f32()? });
        }
        let n = v.len();
        self.backend.from_host(HostBuffer::F32(v), &[n])
    }

    /// One grouped GEMM over the row groups (`rows_of(j)` → the GEMM's `(m, n, k)`, offsets).
    fn gemm(
        &self,
        a: &DeviceTensor,
        b: &DeviceTensor,
        c: &mut DeviceTensor,
        groups: Vec<GemmGroup>,
        trans_a: bool,
        trans_b: bool,
        beta: f32,
    ) -> Result<()> {
        let spec = GroupedGemmSpec { trans_a, trans_b, alpha: 1.0, beta };
        if self.grouped {
            self.backend.grouped_gemm(a, b, c, &groups, spec)
        } else {
            groups.iter().try_for_each(|g| self.backend.grouped_gemm(a, b, c, std::slice::from_ref(g), spec))
        }
    }

    /// `Z (M, C) = w ⊙ expert(x)` for rows grouped by `sizes`; fills `saved`.
    pub fn forward(&self, x: DeviceTensor, w: Vec<f32>, sizes: &[usize], saved: &mut ExpertSaved) -> Result<Vec<f32>> {
        let bk = self.backend.as_ref();
        let (c, f, g1) = (self.hidden, self.ffn, self.fc1_width());
        let m: usize = sizes.iter().sum();
        let starts: Vec<usize> = sizes.iter().scan(0, |s, &n| Some(std::mem::replace(s, *s + n))).collect();
        let groups = |n: usize, k: usize| -> Vec<GemmGroup> {
            sizes
                .iter()
                .enumerate()
                .map(|(j, &rows)| GemmGroup {
                    m: rows,
                    n,
                    k,
                    a_offset: starts[j] * k,
                    b_offset: j * n * k,
                    c_offset: starts[j] * n,
                })
                .collect()
        };
        let mut h1 = bk.zeros(&[m, g1], DType::F32)?;
        let mut act = bk.zeros(&[m, f], DType::F32)?;
        let mut y = bk.zeros(&[m, c], DType::F32)?;
        if m > 0 {
            self.gemm(&x, &self.pack(&self.fc1, false)?, &mut h1, groups(g1, c), false, true, 0.0)?;
            if self.swiglu {
                bk.swiglu_forward(&h1, &mut act)?;
            } else {
                bk.gelu_forward(&h1, &mut act)?;
            }
            self.gemm(&act, &self.pack(&self.fc2, false)?, &mut y, groups(c, f), false, true, 0.0)?;
        }
        let yv = y.host_f32()?;
        let z: Vec<f32> = yv.chunks(c.max(1)).zip(&w).flat_map(|(row, &wi)| row.iter().map(move |v| v * wi)).collect();
        let sizes_i32: Vec<i32> = sizes.iter().map(|&s| s as i32).collect();
        *saved = ExpertSaved {
            w: bk.from_host(HostBuffer::F32(w), &[m])?,
            sizes: bk.from_host(HostBuffer::I32(sizes_i32), &[sizes.len()])?,
            x,
            h1,
            act,
            y,
        };
        Ok(z)
    }

    /// From `dZ (M, C)`: returns `(dx (M, C), dw (M))` and accumulates the experts' weight
    /// gradients.
    pub fn backward(&mut self, saved: &ExpertSaved, dz: &[f32]) -> Result<(Vec<f32>, Vec<f32>)> {
        let bk = self.backend.clone();
        let bk = bk.as_ref();
        let (c, f, g1) = (self.hidden, self.ffn, self.fc1_width());
        let sizes: Vec<usize> = saved.sizes.host_i32()?.iter().map(|&s| s as usize).collect();
        let m: usize = sizes.iter().sum();
        let (w, y) = (saved.w.host_f32()?, saved.y.host_f32()?);
        // dw = <y, dz>; dy = w·dz.
        let dw: Vec<f32> = (0..m).map(|r| (0..c).map(|i| y[r * c + i] * dz[r * c + i]).sum()).collect();
        let dy: Vec<f32> = (0..m * c).map(|i| w[i / c] * dz[i]).collect();
        if m == 0 {
            return Ok((Vec::new(), dw));
        }
        let starts: Vec<usize> = sizes.iter().scan(0, |s, &n| Some(std::mem::replace(s, *s + n))).collect();
        let dy = bk.from_host(HostBuffer::F32(dy), &[m, c])?;
        let groups = |f: &dyn Fn(usize, usize, usize) -> GemmGroup| -> Vec<GemmGroup> {
            sizes.iter().enumerate().map(|(j, &rows)| f(j, rows, starts[j])).collect()
        };
        // dA (M,F) = dY · W2 (W2_j stored (C, F) = [k, n]).
        let w2 = self.pack(&self.fc2, false)?;
        let mut d_act = bk.zeros(&[m, f], DType::F32)?;
        let g = groups(&|j, rows, s| GemmGroup {
            m: rows,
            n: f,
            k: c,
            a_offset: s * c,
            b_offset: j * c * f,
            c_offset: s * f,
        });
        self.gemm(&dy, &w2, &mut d_act, g, false, false, 0.0)?;
        // dW2_j (C, F) += dY_j^T · A_j.
        let mut dw2 = self.pack(&self.fc2, true)?;
        let g = groups(&|j, rows, s| GemmGroup {
            m: c,
            n: f,
            k: rows,
            a_offset: s * c,
            b_offset: s * f,
            c_offset: j * c * f,
        });
        self.gemm(&dy, &saved.act, &mut dw2, g, true, false, 1.0)?;
        // dH1 through the activation.
        let mut d_h1 = bk.zeros(&[m, g1], DType::F32)?;
        if self.swiglu {
            bk.swiglu_backward(&saved.h1, &d_act, &mut d_h1)?;
        } else {
            bk.gelu_backward(&saved.h1, &d_act, &mut d_h1)?;
        }
        // dW1_j (G1, C) += dH1_j^T · X_j.
        let mut dw1 = self.pack(&self.fc1, true)?;
        let g = groups(&|j, rows, s| GemmGroup {
            m: g1,
            n: c,
            k: rows,
            a_offset: s * g1,
            b_offset: s * c,
            c_offset: j * g1 * c,
        });
        self.gemm(&d_h1, &saved.x, &mut dw1, g, true, false, 1.0)?;
        // dX (M, C) = dH1 · W1 (W1_j stored (G1, C) = [k, n]).
        let w1 = self.pack(&self.fc1, false)?;
        let mut dx = bk.zeros(&[m, c], DType::F32)?;
        let g = groups(&|j, rows, s| GemmGroup {
            m: rows,
            n: c,
            k: g1,
            a_offset: s * g1,
            b_offset: j * g1 * c,
            c_offset: s * c,
        });
        self.gemm(&d_h1, &w1, &mut dx, g, false, false, 0.0)?;
        // Unpack the accumulated gradients into the per-expert params.
        let (dw1, dw2) = (dw1.host_f32()?, dw2.host_f32()?);
        for (j, p) in self.fc1.iter_mut().enumerate() {
            p.grad.host_f32_mut()?.copy_from_slice(&dw1[j * g1 * c..(j + 1) * g1 * c]);
        }
        for (j, p) in self.fc2.iter_mut().enumerate() {
            p.grad.host_f32_mut()?.copy_from_slice(&dw2[j * c * f..(j + 1) * c * f]);
        }
        Ok((dx.host_f32()?.to_vec(), dw))
    }
}

/// Slice `rank` of `size` of a whole 2-D `p` along `axis`, each of its `chunks` equal blocks
/// along that axis split on its own; the layout records the split (checkpoints store the
/// whole tensor whatever the split).
fn split_param(
    backend: &dyn Backend,
    p: Param,
    axis: usize,
    chunks: usize,
    (rank, size): (usize, usize),
) -> Result<Param> {
    if size == 1 {
        return Ok(p);
    }
    let shape = p.value.shape().to_vec();
    let (rows, cols) = (shape[0], shape[1]);
    let v = p.value.host_f32()?;
    let (local, values): (Vec<usize>, Vec<f32>) = if axis == 0 {
        let (block, part) = (rows / chunks, rows / chunks / size);
        let mut out = Vec::with_capacity(rows / size * cols);
        for c in 0..chunks {
            let r0 = c * block + rank * part;
            out.extend_from_slice(&v[r0 * cols..(r0 + part) * cols]);
        }
        (vec![rows / size, cols], out)
    } else {
        let part = cols / size;
        let out = v.chunks(cols).flat_map(|row| row[rank * part..(rank + 1) * part].iter().copied()).collect();
        (vec![rows, part], out)
    };
    let mut layout = p.layout.clone();
    (layout.tp_axis, layout.tp_rank, layout.tp_size, layout.tp_chunks) = (Some(axis), rank, size, chunks);
    Ok(Param {
        name: p.name,
        value: backend.from_host(HostBuffer::F32(values), &local)?,
        grad: backend.zeros(&local, DType::F32)?,
        layout,
    })
}

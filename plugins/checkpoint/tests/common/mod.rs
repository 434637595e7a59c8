//! Shared test fixtures: a tiny GPT-like parameter set whose values are a pure function of
//! (tensor seed, global element index), so any TP slice can be checked against the whole.
#![allow(dead_code)] // each test binary uses a different subset

use megatron_core::{Backend, DType, DeviceTensor, HostBuffer, OptimizerState, Param, ParamLayout};

/// `(name, global shape, tp axis, seed)` of every parameter.
pub const SPEC: &[(&str, &[usize], Option<usize>, u32)] = &[
    ("embedding.word_embeddings.weight", &[8, 4], Some(0), 1),
    ("decoder.layers.0.self_attention.linear_qkv.weight", &[12, 4], Some(0), 2),
    ("decoder.layers.0.self_attention.linear_qkv.bias", &[12], Some(0), 3),
    ("decoder.layers.0.self_attention.linear_proj.weight", &[4, 6], Some(1), 4),
    ("decoder.final_layernorm.weight", &[4], None, 5),
    // SwiGLU's [gate; up]: two blocks, each split over the TP ranks on its own.
    ("decoder.layers.0.mlp.linear_fc1.weight", &[8, 4], Some(0), 6),
];

/// TP blocks of a parameter (the gated `linear_fc1` has two).
pub fn chunks_of(name: &str) -> usize {
    if name.ends_with("linear_fc1.weight") {
        2
    } else {
        1
    }
}

/// Naive local tensor of a rank: the global rows (or columns) the rank holds, listed one by
/// one (block `c`'s slice `tp_rank` for every block), independent of `ParamLayout`'s methods.
pub fn true_local(l: &ParamLayout, local: &[usize], seed: u32) -> Vec<f32> {
    let Some(axis) = l.tp_axis else { return slice_values(&l.global_shape, &full(local), seed) };
    let chunks = l.tp_chunks.max(1);
    let (lb, gb) = (local[axis] / chunks, l.global_shape[axis] / chunks);
    let mut out = Vec::new();
    if axis == 0 {
        for c in 0..chunks {
            for i in 0..lb {
                let mut slice = full(local);
                slice[0] = (c * gb + l.tp_rank * lb + i, 1);
                out.extend(slice_values(&l.global_shape, &slice, seed));
            }
        }
    } else {
        assert_eq!(chunks, 1);
        let mut slice = full(local);
        slice[axis] = (l.tp_rank * local[axis], local[axis]);
        out = slice_values(&l.global_shape, &slice, seed);
    }
    out
}

fn full(shape: &[usize]) -> Vec<(usize, usize)> {
    shape.iter().map(|&n| (0, n)).collect()
}

/// Optimizer states and the seed offset of their values.
pub const STATES: &[(&str, u32)] = &[("exp_avg", 100), ("exp_avg_sq", 200)];

/// Value of global element `i` of the tensor with `seed`.
pub fn value(seed: u32, i: usize) -> f32 {
    seed as f32 * 1000.0 + i as f32 * 0.5
}

/// The whole tensor.
pub fn global_values(shape: &[usize], seed: u32) -> Vec<f32> {
    (0..shape.iter().product()).map(|i| value(seed, i)).collect()
}

/// Naive slice of the global tensor: element by element through the global flat index.
pub fn slice_values(global_shape: &[usize], slice: &[(usize, usize)], seed: u32) -> Vec<f32> {
    let extent: Vec<usize> = slice.iter().map(|s| s.1).collect();
    let n: usize = extent.iter().product();
    (0..n)
        .map(|lin| {
            let mut rem = lin;
            let mut idx = vec![0; extent.len()];
            for d in (0..extent.len()).rev() {
                idx[d] = rem % extent[d] + slice[d].0;
                rem /= extent[d];
            }
            let flat = (0..idx.len()).fold(0, |acc, d| acc * global_shape[d] + idx[d]);
            value(seed, flat)
        })
        .collect()
}

pub fn layout(global: &[usize], tp_axis: Option<usize>, tp_rank: usize, tp_size: usize) -> ParamLayout {
    let (tp_rank, tp_size) = if tp_axis.is_some() { (tp_rank, tp_size) } else { (0, 1) };
    ParamLayout {
        global_shape: global.to_vec(),
        tp_axis,
        tp_rank,
        tp_size,
        no_weight_decay: global.len() == 1,
        shared_copy: false,
        expert_parallel: false,
        tp_chunks: 1,
        tp_blocks: Vec::new(),
    }
}

/// [`layout`] of the SPEC parameter `name` (its TP blocks included).
pub fn named_layout(
    name: &str,
    global: &[usize],
    tp_axis: Option<usize>,
    tp_rank: usize,
    tp_size: usize,
) -> ParamLayout {
    ParamLayout { tp_chunks: chunks_of(name), ..layout(global, tp_axis, tp_rank, tp_size) }
}

pub fn local_shape(l: &ParamLayout) -> Vec<usize> {
    let mut s = l.global_shape.clone();
    if let Some(a) = l.tp_axis {
        s[a] /= l.tp_size;
    }
    s
}

/// The parameters of TP rank `tp_rank` of `tp_size`, holding their true slices (or zeros).
pub fn params(b: &dyn Backend, tp_rank: usize, tp_size: usize, zeroed: bool) -> Vec<Param> {
    SPEC.iter()
        .map(|&(name, global, axis, seed)| {
            let l = named_layout(name, global, axis, tp_rank, tp_size);
            let shape = local_shape(&l);
            let value = if zeroed {
                b.zeros(&shape, DType::F32).unwrap()
            } else {
                let vals = true_local(&l, &shape, seed);
                b.from_host(HostBuffer::F32(vals), &shape).unwrap()
            };
            Param { name: name.to_string(), grad: b.zeros(&shape, DType::F32).unwrap(), value, layout: l }
        })
        .collect()
}

/// Adam-like state for `params`, values consistent with the global function.
pub fn optimizer_state(b: &dyn Backend, params: &[Param]) -> OptimizerState {
    let mut tensors = Vec::new();
    for p in params {
        let seed = SPEC.iter().find(|s| s.0 == p.name).unwrap().3;
        for &(state, off) in STATES {
            let vals = true_local(&p.layout, p.value.shape(), seed + off);
            tensors.push((format!("{}.{state}", p.name), b.from_host(HostBuffer::F32(vals), p.value.shape()).unwrap()));
        }
    }
    OptimizerState { scalars: serde_json::json!({"steps": 3, "grad_scaler": {"scale": 1.0}}), tensors }
}

pub fn host_f32(b: &dyn Backend, t: &DeviceTensor) -> Vec<f32> {
    b.to_host(t).unwrap().to_f32_vec()
}

/// Asserts every parameter holds its true slice.
pub fn assert_params_hold_truth(b: &dyn Backend, params: &[Param]) {
    for p in params {
        let seed = SPEC.iter().find(|s| s.0 == p.name).unwrap().3;
        let want = true_local(&p.layout, p.value.shape(), seed);
        assert_eq!(host_f32(b, &p.value), want, "parameter {}", p.name);
    }
}

/// Asserts `state` holds the true slices of [`optimizer_state`] for `params`.
pub fn assert_optimizer_holds_truth(b: &dyn Backend, params: &[Param], state: &OptimizerState) {
    assert_eq!(state.tensors.len(), params.len() * STATES.len());
    for p in params {
        let seed = SPEC.iter().find(|s| s.0 == p.name).unwrap().3;
        for &(name, off) in STATES {
            let key = format!("{}.{name}", p.name);
            let t = &state.tensors.iter().find(|(k, _)| *k == key).unwrap_or_else(|| panic!("missing {key}")).1;
            assert_eq!(t.shape(), p.value.shape(), "{key}");
            let want = true_local(&p.layout, p.value.shape(), seed + off);
            assert_eq!(host_f32(b, t), want, "{key}");
        }
    }
}

pub fn refs(params: &[Param]) -> Vec<&Param> {
    params.iter().collect()
}

pub fn muts(params: &mut [Param]) -> Vec<&mut Param> {
    params.iter_mut().collect()
}

//! Parameter creation: deterministic Megatron initialization and tensor-parallel sharding.
//!
//! Every parameter is generated as the FULL global tensor from its own seed (a hash of the
//! base seed and the parameter name) and this rank then keeps its shard, like Megatron's
//! `--use-cpu-initialization`: the initial model is the same whatever the TP size, which is
//! what makes TP-parity tests and TP-resharded runs comparable.

use crate::precision::Precision;
use anyhow::{bail, Result};
use megatron_core::half::{bf16, f16};
use megatron_core::{Backend, DType, HostBuffer, ParallelContext, Param, ParamLayout};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Normal};
use std::sync::Arc;

/// How a parameter's initial values are drawn (SPEC §4.6).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Init {
    /// `Normal(0, std)`: weights (`init_method`, or `output_layer_init_method` with a smaller std).
    Normal(f32),
    /// Biases and norm biases.
    Zeros,
    /// Norm weights.
    Ones,
}

/// How a parameter is split over the tensor-parallel group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Split {
    /// Held whole by every TP rank.
    Replicated,
    /// Dim 0 split (column-parallel weights and biases, vocab-parallel embeddings). With
    /// `chunks > 1` the dim is made of `chunks` logical blocks (gate and up of a gated MLP) and
    /// each rank keeps its slice of every block, local layout `[block0_local; block1_local]`.
    Rows { chunks: usize },
    /// Dim 1 split (row-parallel weights).
    Cols,
}

/// SplitMix64 finalizer: spreads nearby inputs (seed + 1, seed + 2) over the whole range.
pub fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Seed of one parameter: FNV-1a of its name, mixed with the base seed.
pub fn param_seed(base_seed: u64, name: &str) -> u64 {
    let mut h: u64 = 0xCBF2_9CE4_8422_2325;
    for b in name.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01B3);
    }
    mix64(h ^ mix64(base_seed))
}

/// The full global tensor of a parameter, row-major.
pub fn init_global(init: Init, numel: usize, seed: u64) -> Result<Vec<f32>> {
    Ok(match init {
        Init::Zeros => vec![0.0; numel],
        Init::Ones => vec![1.0; numel],
        Init::Normal(std) => {
            let normal = Normal::new(0.0f32, std)
                .map_err(|e| anyhow::anyhow!("invalid init std {std} (init_method_std must be > 0): {e}"))?;
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            (0..numel).map(|_| normal.sample(&mut rng)).collect()
        }
    })
}

/// Local shape of a parameter of `global_shape` under `split` on a group of `tp_size`.
pub fn local_shape(global_shape: &[usize], split: Split, tp_size: usize) -> Result<Vec<usize>> {
    let mut shape = global_shape.to_vec();
    let (axis, chunks) = match split {
        Split::Replicated => return Ok(shape),
        Split::Rows { chunks } => (0, chunks.max(1)),
        Split::Cols => (1, 1),
    };
    if axis >= shape.len() || !shape[axis].is_multiple_of(chunks * tp_size) {
        bail!(
            "cannot split dim {axis} of shape {global_shape:?} into {chunks} block(s) x {tp_size} tensor-parallel \
             ranks; choose sizes divisible by --tensor-model-parallel-size"
        );
    }
    shape[axis] /= tp_size;
    Ok(shape)
}

/// This rank's shard of a row-major global tensor (see [`Split`]).
pub fn take_shard(
    global: &[f32],
    global_shape: &[usize],
    split: Split,
    tp_rank: usize,
    tp_size: usize,
) -> Result<Vec<f32>> {
    let local = local_shape(global_shape, split, tp_size)?;
    match split {
        Split::Replicated => Ok(global.to_vec()),
        Split::Rows { chunks } => {
            let chunks = chunks.max(1);
            let row: usize = global_shape[1..].iter().product();
            let block_rows = global_shape[0] / chunks;
            let local_block_rows = local[0] / chunks;
            let mut out = Vec::with_capacity(local.iter().product());
            for c in 0..chunks {
                let start = (c * block_rows + tp_rank * local_block_rows) * row;
                out.extend_from_slice(&global[start..start + local_block_rows * row]);
            }
            Ok(out)
        }
        Split::Cols => {
            let (rows, cols, local_cols) = (global_shape[0], global_shape[1], local[1]);
            let rest: usize = global_shape[2..].iter().product();
            let mut out = Vec::with_capacity(local.iter().product());
            for r in 0..rows {
                let start = (r * cols + tp_rank * local_cols) * rest;
                out.extend_from_slice(&global[start..start + local_cols * rest]);
            }
            Ok(out)
        }
    }
}

/// What modules need to create their parameters: the backend, this rank's parallel
/// context, the base seed and the dtypes ([`Precision`]) of parameters and activations.
#[derive(Clone)]
pub struct ModuleBuilder {
    pub backend: Arc<dyn Backend>,
    pub ctx: ParallelContext,
    pub seed: u64,
    pub precision: Precision,
    /// `--sequence-parallel` (SPEC §5.3) in effect: the providers build the sequence-parallel
    /// linears and the modules keep the residual stream as this rank's token shard. Only ever
    /// true at tp > 1 (see [`ModuleBuilder::with_sequence_parallel`]).
    pub sequence_parallel: bool,
}

impl ModuleBuilder {
    /// An fp32 builder.
    pub fn new(backend: Arc<dyn Backend>, ctx: ParallelContext, seed: u64) -> ModuleBuilder {
        ModuleBuilder { backend, ctx, seed, precision: Precision::default(), sequence_parallel: false }
    }

    /// The same builder making modules of `precision`.
    pub fn with_precision(mut self, precision: Precision) -> ModuleBuilder {
        self.precision = precision;
        self
    }

    /// dtype of parameters and activations.
    pub fn dtype(&self) -> DType {
        self.precision.params
    }

    /// Turns sequence parallelism on when `on` and tp > 1 (at tp = 1 there is nothing to shard,
    /// Megatron switches it off there too).
    pub fn with_sequence_parallel(mut self, on: bool) -> ModuleBuilder {
        self.sequence_parallel = on && self.ctx.tp_size() > 1;
        self
    }

    pub fn tp_size(&self) -> usize {
        self.ctx.tp_size()
    }

    pub fn tp_rank(&self) -> usize {
        self.ctx.tp_rank
    }

    /// Creates parameter `name` of global shape `global_shape`, initialized per `init` and
    /// sharded per `split`; 1-D parameters (biases, norms) get no weight decay.
    pub fn param(&self, name: &str, global_shape: &[usize], split: Split, init: Init) -> Result<Param> {
        let global = init_global(init, global_shape.iter().product(), param_seed(self.seed, name))?;
        let (tp_rank, tp_size) = (self.tp_rank(), self.tp_size());
        let shard = take_shard(&global, global_shape, split, tp_rank, tp_size)
            .map_err(|e| anyhow::anyhow!("parameter `{name}`: {e}"))?;
        let shape = local_shape(global_shape, split, tp_size)?;
        // Drawn in fp32, then rounded once to the parameter dtype (Megatron initialises the
        // fp32 tensor and casts the module with `.bfloat16()`/`.half()`).
        let value = self.backend.from_host(round_to(shard, self.precision.params)?, &shape)?;
        let grad = self.backend.zeros(&shape, self.precision.grads)?;
        let (tp_axis, tp_chunks) = match split {
            Split::Replicated => (None, 1),
            Split::Rows { chunks } => (Some(0), chunks.max(1)),
            Split::Cols => (Some(1), 1),
        };
        let layout = ParamLayout {
            global_shape: global_shape.to_vec(),
            tp_axis,
            tp_rank,
            tp_size,
            no_weight_decay: global_shape.len() == 1,
            shared_copy: false,
            expert_parallel: false,
            tp_chunks,
            tp_blocks: Vec::new(),
        };
        Ok(Param { name: name.to_string(), value, grad, layout })
    }
}

/// `v` rounded (nearest even) to the float dtype `dtype`.
pub fn round_to(v: Vec<f32>, dtype: DType) -> Result<HostBuffer> {
    Ok(match dtype {
        DType::F32 => HostBuffer::F32(v),
        DType::BF16 => HostBuffer::BF16(v.into_iter().map(bf16::from_f32).collect()),
        DType::F16 => HostBuffer::F16(v.into_iter().map(f16::from_f32).collect()),
        other => bail!("parameters must be a float type, not {other}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_concatenate_to_the_global_tensor() {
        let global: Vec<f32> = (0..24).map(|x| x as f32).collect();
        let shape = [4, 6];
        let rows: Vec<f32> =
            (0..2).flat_map(|r| take_shard(&global, &shape, Split::Rows { chunks: 1 }, r, 2).unwrap()).collect();
        assert_eq!(rows, global);
        let c0 = take_shard(&global, &shape, Split::Cols, 0, 2).unwrap();
        let c1 = take_shard(&global, &shape, Split::Cols, 1, 2).unwrap();
        assert_eq!(c0[..3], global[..3]);
        assert_eq!(c1[..3], global[3..6]);
        // Gated: rank 1 keeps row 1 of block 0 and row 3 (= row 1 of block 1).
        let g1 = take_shard(&global, &shape, Split::Rows { chunks: 2 }, 1, 2).unwrap();
        assert_eq!(g1[..6], global[6..12]);
        assert_eq!(g1[6..], global[18..24]);
        assert!(take_shard(&global, &shape, Split::Cols, 0, 4).is_err());
    }

    #[test]
    fn init_is_deterministic_per_name_and_has_the_right_std() {
        let a = init_global(Init::Normal(0.02), 20000, param_seed(7, "w")).unwrap();
        let b = init_global(Init::Normal(0.02), 20000, param_seed(7, "w")).unwrap();
        let c = init_global(Init::Normal(0.02), 20000, param_seed(7, "v")).unwrap();
        assert_eq!(a, b);
        assert_ne!(a, c);
        let var = a.iter().map(|x| (*x as f64).powi(2)).sum::<f64>() / a.len() as f64;
        assert!((var.sqrt() - 0.02).abs() < 0.02 * 0.03, "std {}", var.sqrt());
    }
}

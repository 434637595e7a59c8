//! The model shape and parallel layout a Megatron checkpoint's `args` describe ([`Shape`]),
//! and which layers each pipeline stage / virtual chunk holds.

use crate::value::Value;
use anyhow::{anyhow, bail, Result};
use std::path::Path;

/// The model shape and parallel layout a checkpoint's `args` describe.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Shape {
    pub tp: usize,
    pub pp: usize,
    /// Virtual pipeline chunks per stage (1 without interleaving).
    pub vp: usize,
    pub num_layers: usize,
    pub hidden: usize,
    pub heads: usize,
    pub groups: usize,
    pub head_dim: usize,
    pub ffn: usize,
    pub swiglu: bool,
    pub padded_vocab: usize,
    pub untied: bool,
    pub learned_positions: bool,
    pub first_stage_layers: Option<usize>,
    pub last_stage_layers: Option<usize>,
}

fn arg_usize(args: &Value, key: &str, path: &Path) -> Result<Option<usize>> {
    match args.get(key) {
        None | Some(Value::None) => Ok(None),
        Some(Value::Int(i)) if (0..=(1 << 40)).contains(i) => Ok(Some(*i as usize)),
        Some(other) => bail!("{}: args.{key} is {other}, expected a non-negative integer", path.display()),
    }
}

impl Shape {
    pub fn from_args(args: &Value, path: &Path) -> Result<Shape> {
        let need = |k: &str| -> Result<usize> {
            arg_usize(args, k, path)?.ok_or_else(|| anyhow!("{}: args has no `{k}`", path.display()))
        };
        let flag = |k: &str| args.get(k).and_then(Value::as_bool).unwrap_or(false);
        let (hidden, heads) = (need("hidden_size")?, need("num_attention_heads")?);
        if heads == 0 || hidden == 0 {
            bail!("{}: hidden_size and num_attention_heads must be >= 1", path.display());
        }
        let groups = if flag("group_query_attention") { need("num_query_groups")? } else { heads };
        let s = Shape {
            tp: arg_usize(args, "tensor_model_parallel_size", path)?.unwrap_or(1),
            pp: arg_usize(args, "pipeline_model_parallel_size", path)?.unwrap_or(1),
            vp: arg_usize(args, "virtual_pipeline_model_parallel_size", path)?.unwrap_or(1),
            num_layers: need("num_layers")?,
            hidden,
            heads,
            groups,
            head_dim: arg_usize(args, "kv_channels", path)?.unwrap_or(hidden / heads),
            ffn: arg_usize(args, "ffn_hidden_size", path)?.unwrap_or(4 * hidden),
            swiglu: flag("swiglu"),
            padded_vocab: need("padded_vocab_size")?,
            untied: flag("untie_embeddings_and_output_weights"),
            learned_positions: args
                .get("position_embedding_type")
                .and_then(Value::as_str)
                .unwrap_or("learned_absolute")
                == "learned_absolute",
            first_stage_layers: arg_usize(args, "decoder_first_pipeline_num_layers", path)?,
            last_stage_layers: arg_usize(args, "decoder_last_pipeline_num_layers", path)?,
        };
        let ok = s.tp >= 1
            && s.pp >= 1
            && s.vp >= 1
            && s.groups >= 1
            && s.heads.is_multiple_of(s.groups)
            && s.groups.is_multiple_of(s.tp)
            && s.ffn.is_multiple_of(s.tp)
            && s.padded_vocab.is_multiple_of(s.tp)
            && s.num_layers <= 1 << 16;
        if !ok {
            bail!(
                "{}: inconsistent args (tp {}, heads {}, query groups {}, ffn {}, padded vocab {})",
                path.display(),
                s.tp,
                s.heads,
                s.groups,
                s.ffn,
                s.padded_vocab
            );
        }
        s.stage_layers(0, 0)?;
        Ok(s)
    }

    /// `(first global layer, count)` of pipeline stage `pp_rank`, virtual chunk `chunk`.
    pub fn stage_layers(&self, pp_rank: usize, chunk: usize) -> Result<(usize, usize)> {
        let (l, pp, vp) = (self.num_layers, self.pp, self.vp);
        if self.first_stage_layers.is_some() || self.last_stage_layers.is_some() {
            if vp > 1 {
                bail!("uneven first/last pipeline stages with virtual pipelining are not supported");
            }
            let first = self.first_stage_layers;
            let last = self.last_stage_layers;
            let middle_stages = pp - usize::from(first.is_some()) - usize::from(last.is_some());
            let middle_layers = l
                .checked_sub(first.unwrap_or(0) + last.unwrap_or(0))
                .ok_or_else(|| anyhow!("first/last stage layers exceed num_layers"))?;
            if middle_stages == 0 && middle_layers != 0 || middle_stages > 0 && middle_layers % middle_stages != 0 {
                bail!("{middle_layers} middle layers do not split evenly over {middle_stages} stages");
            }
            let per = middle_layers.checked_div(middle_stages).unwrap_or(0);
            let count = |r: usize| match (r, first, last) {
                (0, Some(f), _) => f,
                (r, _, Some(x)) if r == pp - 1 => x,
                _ => per,
            };
            let start = (0..pp_rank).map(count).sum();
            return Ok((start, count(pp_rank)));
        }
        if l % (pp * vp) != 0 {
            bail!("num_layers {l} is not divisible by pp {pp} x virtual chunks {vp}");
        }
        let per = l / (pp * vp);
        Ok((chunk * (l / vp) + pp_rank * per, per))
    }
}

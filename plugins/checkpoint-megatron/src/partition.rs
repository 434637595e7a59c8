//! Megatron's tensor- and pipeline-parallel partitioning of a GPT (SPEC §5, §7.6), both ways:
//! [`merge`] joins the tp shards of one tensor, [`split`] cuts a full tensor for a tp rank,
//! [`local_to_global`] / [`global_to_local`] map stage-local layer names to global ones.
//!
//! Rules: word embedding / output layer are vocab-parallel (rows); `linear_qkv` is column-
//! parallel (rows; each rank holds whole query groups `[ng/tp, np/ng + 2, hn]`, so a plain row
//! concatenation keeps the group-interleaved layout); `linear_fc1` is column-parallel, and with
//! SwiGLU each rank holds `[gate_local; up_local]`, so shards are split into halves first and
//! the full tensor is `[gate; up]`; `linear_proj` / `linear_fc2` weights are row-parallel
//! (columns); norms, position embeddings and row-parallel biases are replicated.

pub use crate::shape::Shape;
use crate::torchzip::TensorData;
use anyhow::{anyhow, bail, Result};
use std::collections::BTreeMap;
use std::path::Path;

/// Megatron-LM's pre-Core (`megatron.legacy.model`) names → Megatron-Core names.
fn from_legacy_model_name(key: &str) -> String {
    let k = key.strip_prefix("language_model.").unwrap_or(key);
    let k = if let Some(rest) = k.strip_prefix("encoder.") { format!("decoder.{rest}") } else { k.to_string() };
    k.replace(".input_norm.", ".input_layernorm.")
        .replace(".self_attention.query_key_value.", ".self_attention.linear_qkv.")
        .replace(".self_attention.dense.", ".self_attention.linear_proj.")
        .replace(".post_attention_norm.", ".pre_mlp_layernorm.")
        .replace(".post_attention_layernorm.", ".pre_mlp_layernorm.")
        .replace(".mlp.dense_h_to_4h.", ".mlp.linear_fc1.")
        .replace(".mlp.dense_4h_to_h.", ".mlp.linear_fc2.")
        .replace("decoder.final_norm.", "decoder.final_layernorm.")
}

/// Megatron-Core's (local-spec) name of `key`: pre-Core names translated, and the norms that
/// Transformer Engine fuses into the next linear layer (`linear_qkv.layer_norm_weight`; also
/// what `torch_dist` checkpoints call them) given their own modules again.
pub fn normalize_name(key: &str) -> String {
    let k = if key.starts_with("language_model.") { from_legacy_model_name(key) } else { key.to_string() };
    k.replace(".self_attention.linear_qkv.layer_norm_weight", ".input_layernorm.weight")
        .replace(".self_attention.linear_qkv.layer_norm_bias", ".input_layernorm.bias")
        .replace(".mlp.linear_fc1.layer_norm_weight", ".pre_mlp_layernorm.weight")
        .replace(".mlp.linear_fc1.layer_norm_bias", ".pre_mlp_layernorm.bias")
}

/// Whether `name` (full, megatron-rs) is a GPT tensor megatron-rs knows how to place.
pub fn is_known(name: &str) -> Result<()> {
    kind(name).map(|_| ())
}

/// The global megatron-rs name of stage-local `key` (pipeline stage `pp_rank`, virtual chunk
/// `chunk`), or `None` for entries that are not parameters of the full model (Transformer
/// Engine `_extra_state`, the last stage's copy of a tied embedding).
pub fn local_to_global(key: &str, s: &Shape, pp_rank: usize, chunk: usize) -> Result<Option<String>> {
    if key.ends_with("_extra_state") {
        return Ok(None);
    }
    let mut k = normalize_name(key);
    if k == "output_layer.weight" && !s.untied {
        return Ok(None);
    }
    if let Some(rest) = k.strip_prefix("decoder.layers.") {
        let (idx, tail) = rest.split_once('.').ok_or_else(|| anyhow!("malformed layer name"))?;
        let i: usize = idx.parse().map_err(|_| anyhow!("malformed layer index `{idx}`"))?;
        let (start, count) = s.stage_layers(pp_rank, chunk)?;
        if i >= count {
            bail!("layer {i} of pipeline stage {pp_rank} (chunk {chunk}), which holds {count} layers");
        }
        k = format!("decoder.layers.{}.{tail}", start + i);
    }
    kind(&k)?;
    Ok(Some(k))
}

/// `decoder.layers.{global}.x` → `(pp_rank, chunk, local name)` for a target layout.
pub fn global_to_local(name: &str, s: &Shape) -> Result<Vec<(usize, usize, String)>> {
    let Some(rest) = name.strip_prefix("decoder.layers.") else {
        let first = (0, 0, name.to_string());
        let last = (s.pp - 1, s.vp - 1, name.to_string());
        return Ok(match name {
            n if n.starts_with("embedding.") => vec![first],
            _ => vec![last],
        });
    };
    let (idx, tail) = rest.split_once('.').ok_or_else(|| anyhow!("malformed layer name `{name}`"))?;
    let g: usize = idx.parse().map_err(|_| anyhow!("malformed layer index in `{name}`"))?;
    for chunk in 0..s.vp {
        for pp in 0..s.pp {
            let (start, count) = s.stage_layers(pp, chunk)?;
            if (start..start + count).contains(&g) {
                return Ok(vec![(pp, chunk, format!("decoder.layers.{}.{tail}", g - start))]);
            }
        }
    }
    bail!("layer {g} of `{name}` is beyond num_layers {}", s.num_layers)
}

/// How a tensor is partitioned over tensor-parallel ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Vocab,
    Column,
    /// Column-parallel with `[gate; up]` halves per rank (SwiGLU fc1).
    GatedColumn,
    Row,
    Replicated,
}

fn kind(name: &str) -> Result<Kind> {
    Ok(match name {
        "embedding.word_embeddings.weight" | "output_layer.weight" => Kind::Vocab,
        "embedding.position_embeddings.weight" => Kind::Replicated,
        n if n.starts_with("decoder.final_layernorm.") => Kind::Replicated,
        n if n.starts_with("decoder.layers.") => {
            let tail = n.splitn(4, '.').nth(3).unwrap_or("");
            match tail {
                "self_attention.linear_qkv.weight" | "self_attention.linear_qkv.bias" => Kind::Column,
                "mlp.linear_fc1.weight" | "mlp.linear_fc1.bias" => Kind::GatedColumn,
                "self_attention.linear_proj.weight" | "mlp.linear_fc2.weight" => Kind::Row,
                "self_attention.linear_proj.bias"
                | "mlp.linear_fc2.bias"
                | "input_layernorm.weight"
                | "input_layernorm.bias"
                | "pre_mlp_layernorm.weight"
                | "pre_mlp_layernorm.bias" => Kind::Replicated,
                t => bail!("unsupported layer tensor `{t}` (megatron-rs reads GPT layers: attention + dense MLP)"),
            }
        }
        n => bail!("unsupported tensor `{n}` (not part of a GPT model)"),
    })
}

/// `[rows, cols]` of a 1-D or 2-D tensor (1-D as one column).
fn rows_cols(t: &TensorData, name: &str) -> Result<(usize, usize)> {
    match t.shape.as_slice() {
        [r] => Ok((*r, 1)),
        [r, c] => Ok((*r, *c)),
        s => bail!("tensor `{name}` has shape {s:?}, expected 1-D or 2-D"),
    }
}

/// Joins the tp shards of `name` (rank order) into the full tensor.
pub fn merge(name: &str, shards: Vec<TensorData>, s: &Shape) -> Result<TensorData> {
    let k = kind(name)?;
    let k = if k == Kind::GatedColumn && !s.swiglu { Kind::Column } else { k };
    let first = &shards[0];
    for (r, t) in shards.iter().enumerate() {
        if t.dtype != first.dtype || t.shape.len() != first.shape.len() {
            bail!(
                "tensor `{name}`: tp rank {r} has {} {:?}, rank 0 has {} {:?}",
                t.dtype.name(),
                t.shape,
                first.dtype.name(),
                first.shape
            );
        }
    }
    let el = first.dtype.size();
    let (rows, cols) = rows_cols(first, name)?;
    for (r, t) in shards.iter().enumerate() {
        if rows_cols(t, name)? != (rows, cols) {
            bail!("tensor `{name}`: tp rank {r} has shape {:?}, rank 0 has {:?}", t.shape, first.shape);
        }
    }
    let tp = shards.len();
    let mut shape = first.shape.clone();
    let bytes = match k {
        Kind::Replicated => return Ok(shards.into_iter().next().expect("tp >= 1")),
        Kind::Vocab | Kind::Column => {
            shape[0] = rows * tp;
            shards.iter().flat_map(|t| t.bytes.iter().copied()).collect()
        }
        Kind::GatedColumn => {
            if rows % 2 != 0 {
                bail!("tensor `{name}`: SwiGLU shard has an odd number of rows {rows}");
            }
            shape[0] = rows * tp;
            let half = rows / 2 * cols * el;
            let mut out = Vec::with_capacity(half * 2 * tp);
            for part in 0..2 {
                for t in &shards {
                    out.extend_from_slice(&t.bytes[part * half..(part + 1) * half]);
                }
            }
            out
        }
        Kind::Row => {
            if first.shape.len() != 2 {
                bail!("row-parallel tensor `{name}` must be 2-D");
            }
            shape[1] = cols * tp;
            let mut out = Vec::with_capacity(rows * cols * tp * el);
            for r in 0..rows {
                for t in &shards {
                    out.extend_from_slice(&t.bytes[r * cols * el..(r + 1) * cols * el]);
                }
            }
            out
        }
    };
    Ok(TensorData { dtype: first.dtype, shape, bytes })
}

/// The tp rank `rank`'s shard (of `tp`) of the full tensor `t` named `name`.
pub fn split(name: &str, t: &TensorData, swiglu: bool, rank: usize, tp: usize) -> Result<TensorData> {
    let k = kind(name)?;
    let k = if k == Kind::GatedColumn && !swiglu { Kind::Column } else { k };
    let el = t.dtype.size();
    let (rows, cols) = rows_cols(t, name)?;
    let mut shape = t.shape.clone();
    let bytes = match k {
        Kind::Replicated => return Ok(t.clone()),
        Kind::Vocab | Kind::Column => {
            if rows % tp != 0 {
                bail!("tensor `{name}`: {rows} rows do not split over tp {tp}");
            }
            let n = rows / tp;
            shape[0] = n;
            t.bytes[rank * n * cols * el..(rank + 1) * n * cols * el].to_vec()
        }
        Kind::GatedColumn => {
            if rows % (2 * tp) != 0 {
                bail!("tensor `{name}`: {rows} rows do not split into SwiGLU halves over tp {tp}");
            }
            let n = rows / 2 / tp;
            shape[0] = 2 * n;
            let mut out = Vec::with_capacity(2 * n * cols * el);
            for part in 0..2 {
                let start = (part * rows / 2 + rank * n) * cols * el;
                out.extend_from_slice(&t.bytes[start..start + n * cols * el]);
            }
            out
        }
        Kind::Row => {
            if t.shape.len() != 2 || cols % tp != 0 {
                bail!("tensor `{name}`: {cols} columns do not split over tp {tp}");
            }
            let n = cols / tp;
            shape[1] = n;
            let mut out = Vec::with_capacity(rows * n * el);
            for r in 0..rows {
                let start = (r * cols + rank * n) * el;
                out.extend_from_slice(&t.bytes[start..start + n * el]);
            }
            out
        }
    };
    Ok(TensorData { dtype: t.dtype, shape, bytes })
}

/// Checks the reassembled model has every tensor of the shape's GPT, with the right sizes.
pub fn check_complete(t: &BTreeMap<String, TensorData>, s: &Shape, dir: &Path) -> Result<()> {
    let qkv_rows = (s.heads + 2 * s.groups) * s.head_dim;
    let fc1_rows = if s.swiglu { 2 * s.ffn } else { s.ffn };
    let mut want: Vec<(String, Vec<usize>)> =
        vec![("embedding.word_embeddings.weight".into(), vec![s.padded_vocab, s.hidden])];
    for i in 0..s.num_layers {
        want.push((format!("decoder.layers.{i}.self_attention.linear_qkv.weight"), vec![qkv_rows, s.hidden]));
        want.push((
            format!("decoder.layers.{i}.self_attention.linear_proj.weight"),
            vec![s.hidden, s.heads * s.head_dim],
        ));
        want.push((format!("decoder.layers.{i}.mlp.linear_fc1.weight"), vec![fc1_rows, s.hidden]));
        want.push((format!("decoder.layers.{i}.mlp.linear_fc2.weight"), vec![s.hidden, s.ffn]));
        want.push((format!("decoder.layers.{i}.input_layernorm.weight"), vec![s.hidden]));
        want.push((format!("decoder.layers.{i}.pre_mlp_layernorm.weight"), vec![s.hidden]));
    }
    want.push(("decoder.final_layernorm.weight".into(), vec![s.hidden]));
    if s.untied {
        want.push(("output_layer.weight".into(), vec![s.padded_vocab, s.hidden]));
    }
    if s.learned_positions && !t.contains_key("embedding.position_embeddings.weight") {
        bail!("{}: no embedding.position_embeddings.weight, but args say learned_absolute positions", dir.display());
    }
    for (name, shape) in want {
        match t.get(&name) {
            None => bail!(
                "{}: tensor `{name}` is missing (incomplete checkpoint or unexpected model layout)",
                dir.display()
            ),
            Some(got) if got.shape != shape => {
                bail!("{}: tensor `{name}` reassembles to {:?}, args describe {shape:?}", dir.display(), got.shape)
            }
            Some(_) => {}
        }
    }
    Ok(())
}

#[cfg(test)]
#[path = "partition_tests.rs"]
mod tests;

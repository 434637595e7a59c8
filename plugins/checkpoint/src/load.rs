//! Loading: [`load`] opens and validates a checkpoint (metadata, every shard file, every
//! shard's dtype and shape); [`LoadedCheckpoint`] then cuts any rank's slice out of the
//! stored shards, so a checkpoint saved with one TP layout loads into another.

use crate::layout::{read_tracker, resolve_iteration_dir, TRACKER_FILE};
use crate::metadata::{dtype_from_safetensors_name, CheckpointMetadata, TensorEntry, METADATA_FILE, OPTIMIZER_PREFIX};
use crate::region::{checked_volume, intersect, volume, BoxCopy};
use anyhow::{anyhow, bail, Context, Result};
use megatron_core::half::{bf16, f16};
use megatron_core::{Backend, DType, HostBuffer, OptimizerState, Param, ParamLayout};
use memmap2::Mmap;
use safetensors::SafeTensors;
use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

/// An opened, validated checkpoint. Shard files stay memory-mapped until it is dropped.
pub struct LoadedCheckpoint {
    dir: PathBuf,
    pub metadata: CheckpointMetadata,
    files: BTreeMap<String, Mmap>,
}

/// Opens `dir/iter_N` for `iteration`, or for the tracker's iteration when `None`.
///
/// Errors (each naming the file): no tracker, missing directory or `metadata.json`, unknown
/// format or version, missing or truncated shard files, and shard dtypes, shapes or slices
/// that disagree with the metadata.
pub fn load(dir: &Path, iteration: Option<u64>) -> Result<LoadedCheckpoint> {
    let iteration = match iteration {
        Some(i) => i,
        None => read_tracker(dir)?.ok_or_else(|| {
            anyhow!(
                "no checkpoint to load in {}: {TRACKER_FILE} is missing (check --load, or start from scratch)",
                dir.display()
            )
        })?,
    };
    let iter_dir = resolve_iteration_dir(dir, iteration)?;
    let meta_path = iter_dir.join(METADATA_FILE);
    let text = std::fs::read_to_string(&meta_path).with_context(|| {
        format!("cannot read {}: the checkpoint is incomplete or not a megatron-rs checkpoint", meta_path.display())
    })?;
    let metadata = CheckpointMetadata::parse(&text, &meta_path)?;
    if metadata.iteration != iteration {
        bail!("{} says iteration {}, but its directory is for {iteration}", meta_path.display(), metadata.iteration);
    }
    let mut files = BTreeMap::new();
    for shard in metadata.tensors.values().flat_map(|t| &t.shards) {
        if !files.contains_key(&shard.file) {
            files.insert(shard.file.clone(), map_shard_file(&iter_dir, &shard.file)?);
        }
    }
    let ckpt = LoadedCheckpoint { dir: iter_dir, metadata, files };
    for (name, entry) in &ckpt.metadata.tensors {
        ckpt.validate(name, entry)?;
    }
    Ok(ckpt)
}

fn map_shard_file(iter_dir: &Path, name: &str) -> Result<Mmap> {
    if name.contains('/') || name.contains('\\') || name.starts_with('.') {
        bail!("{}: shard file name `{name}` is not a plain file name", iter_dir.join(METADATA_FILE).display());
    }
    let path = iter_dir.join(name);
    let file = File::open(&path).with_context(|| {
        format!(
            "checkpoint shard {} is missing or unreadable: copy the whole {} directory",
            path.display(),
            iter_dir.display()
        )
    })?;
    // SAFETY: committed checkpoint directories are never modified in place (a re-save writes a
    // new directory and renames it), so the mapped bytes do not change while mapped.
    let mmap = unsafe { Mmap::map(&file) }.with_context(|| format!("cannot map {}", path.display()))?;
    SafeTensors::deserialize(&mmap)
        .map_err(|e| anyhow!("checkpoint shard {} is corrupted or truncated: {e:?}", path.display()))?;
    Ok(mmap)
}

impl LoadedCheckpoint {
    /// The iteration directory this was loaded from.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn iteration(&self) -> u64 {
        self.metadata.iteration
    }

    /// Names of every stored tensor (parameters and `optimizer.{param}.{state}`).
    pub fn tensor_names(&self) -> impl Iterator<Item = &str> {
        self.metadata.tensors.keys().map(String::as_str)
    }

    pub fn entry(&self, name: &str) -> Result<&TensorEntry> {
        self.metadata.tensors.get(name).ok_or_else(|| {
            anyhow!(
                "checkpoint {} has no tensor `{name}`: was it saved from a different model \
                 (architecture, --num-layers, tied embeddings)?",
                self.dir.display()
            )
        })
    }

    /// A whole tensor, assembled from its shards: `(data, global shape)`.
    pub fn tensor(&self, name: &str) -> Result<(HostBuffer, Vec<usize>)> {
        let shape = self.entry(name)?.global_shape.clone();
        let data = self.read_region(name, &vec![0; shape.len()], &shape)?;
        Ok((data, shape))
    }

    /// The box of `extent` elements at `start` of the global tensor `name`.
    pub fn read_region(&self, name: &str, start: &[usize], extent: &[usize]) -> Result<HostBuffer> {
        let entry = self.entry(name)?;
        let dtype = dtype_from_safetensors_name(&entry.dtype)?;
        let in_bounds = start.len() == entry.global_shape.len()
            && extent.len() == start.len()
            && (0..start.len()).all(|d| start[d].checked_add(extent[d]).is_some_and(|e| e <= entry.global_shape[d]));
        if !in_bounds {
            bail!("region {extent:?} at {start:?} is outside `{name}` of shape {:?}", entry.global_shape);
        }
        // In bounds of a validated tensor, so no larger than the shards on disk.
        let mut out = vec![0u8; volume(extent) * dtype.size()];
        let mut covered = 0;
        for shard in &entry.shards {
            let Some((at, len)) = intersect(&shard.offset, &shard.shape, start, extent) else { continue };
            let st = self.safetensors(&shard.file)?;
            let view = st.tensor(shard.key(name)).map_err(|e| anyhow!("`{name}` in {}: {e:?}", shard.file))?;
            let copy = BoxCopy { elem: dtype.size(), src: view.data(), src_shape: &shard.shape, dst_shape: extent };
            let src_at: Vec<usize> = at.iter().zip(&shard.offset).map(|(a, o)| a - o).collect();
            let dst_at: Vec<usize> = at.iter().zip(start).map(|(a, s)| a - s).collect();
            copy.copy(&mut out, &src_at, &dst_at, &len);
            covered += volume(&len);
        }
        if covered != volume(extent) {
            bail!(
                "checkpoint {}: the shards of `{name}` do not cover region {extent:?} at {start:?}",
                self.dir.display()
            );
        }
        HostBuffer::from_le_bytes(dtype, &out)
    }

    /// The local tensor (of shape `local`) of a rank with `layout` out of stored tensor `name`:
    /// one region, or the concatenation (along dim 0) of a chunked parameter's block slices.
    pub fn read_shard(&self, name: &str, layout: &ParamLayout, local: &[usize]) -> Result<HostBuffer> {
        let mut pieces = Vec::new();
        for (_, slice) in layout.shard_boxes(local) {
            let (start, extent): (Vec<usize>, Vec<usize>) = slice.into_iter().unzip();
            pieces.push(self.read_region(name, &start, &extent)?);
        }
        if pieces.len() == 1 {
            return Ok(pieces.remove(0));
        }
        let dtype = dtype_from_safetensors_name(&self.entry(name)?.dtype)?;
        let bytes: Vec<u8> = pieces.into_iter().flat_map(|p| p.to_le_bytes()).collect();
        HostBuffer::from_le_bytes(dtype, &bytes)
    }

    /// Overwrites every parameter with its slice of the stored tensor (its
    /// [`megatron_core::ParamLayout::shard_boxes`]). Float values are converted to the
    /// parameter's dtype when the checkpoint stored another float type.
    pub fn load_params(&self, params: &mut [&mut Param], backend: &dyn Backend) -> Result<()> {
        // Every parameter is checked before any is overwritten: a mismatch never leaves a
        // half-loaded model behind.
        for p in params.iter() {
            self.check_global_shape(&p.name, &p.name, &p.layout.global_shape)?;
        }
        for p in params.iter_mut() {
            let extent = p.value.shape().to_vec();
            let data = convert(self.read_shard(&p.name, &p.layout, &extent)?, p.value.dtype(), &p.name)?;
            let loaded = backend.from_host(data, &extent)?;
            backend.copy(&loaded, &mut p.value).with_context(|| format!("cannot load `{}`", p.name))?;
        }
        Ok(())
    }

    /// Loads the model's buffers ([`megatron_core::Model::buffers`], e.g. an MoE router's
    /// expert bias) that the checkpoint stores, like parameters; returns the names of those it
    /// does not store (saved before the buffer existed, or by a run without the feature), which
    /// keep their initial values.
    pub fn load_buffers(&self, buffers: Vec<&mut Param>, backend: &dyn Backend) -> Result<Vec<String>> {
        let (mut stored, missing): (Vec<&mut Param>, Vec<&mut Param>) =
            buffers.into_iter().partition(|b| self.metadata.tensors.contains_key(&b.name));
        self.load_params(&mut stored, backend)?;
        Ok(missing.into_iter().map(|b| b.name.clone()).collect())
    }

    /// Whether the checkpoint holds optimizer state (it was not saved with `--no-save-optim`).
    pub fn has_optimizer_state(&self) -> bool {
        self.metadata.optimizer_saved
    }

    /// The optimizer state for `params` (this rank's slices), keyed `"{param}.{state}"` as
    /// [`megatron_core::Optimizer::load_state`] expects, with the stored scalars.
    pub fn optimizer_state(&self, params: &[&Param], backend: &dyn Backend) -> Result<OptimizerState> {
        if !self.metadata.optimizer_saved {
            bail!(
                "checkpoint {} was saved without optimizer state; load it with --no-load-optim (or --finetune)",
                self.dir.display()
            );
        }
        let mut tensors = Vec::new();
        for p in params {
            let prefix = format!("{OPTIMIZER_PREFIX}{}.", p.name);
            let states = self.metadata.tensors.range(prefix.clone()..).take_while(|(k, _)| k.starts_with(&prefix));
            // A state name has no dots; longer names belong to another parameter.
            for (name, _) in states.filter(|(k, _)| !k[prefix.len()..].contains('.')) {
                self.check_global_shape(name, &p.name, &p.layout.global_shape)?;
                let extent = p.value.shape().to_vec();
                let data = self.read_shard(name, &p.layout, &extent)?;
                tensors.push((name[OPTIMIZER_PREFIX.len()..].to_string(), backend.from_host(data, &extent)?));
            }
        }
        Ok(OptimizerState { scalars: self.metadata.optimizer.clone(), tensors })
    }

    fn check_global_shape(&self, name: &str, param: &str, expected: &[usize]) -> Result<()> {
        let stored = &self.entry(name)?.global_shape;
        if stored != expected {
            bail!(
                "checkpoint {} has {name} {stored:?}, model expects {expected:?} (parameter `{param}`): was it \
                 saved with different model-size flags (--hidden-size, --ffn-hidden-size, --num-attention-heads, \
                 --seq-length/--max-position-embeddings, vocabulary padding)?",
                self.dir.display()
            );
        }
        Ok(())
    }

    fn safetensors(&self, file: &str) -> Result<SafeTensors<'_>> {
        let mmap = self.files.get(file).ok_or_else(|| anyhow!("shard file {file} is not open"))?;
        SafeTensors::deserialize(mmap).map_err(|e| anyhow!("{}: {e:?}", self.dir.join(file).display()))
    }

    /// Checks one metadata entry against the shard files.
    fn validate(&self, name: &str, entry: &TensorEntry) -> Result<()> {
        let dtype = dtype_from_safetensors_name(&entry.dtype).with_context(|| format!("tensor `{name}`"))?;
        let mut covered = 0;
        for (i, shard) in entry.shards.iter().enumerate() {
            let path = self.dir.join(&shard.file);
            let fits = shard.offset.len() == entry.global_shape.len()
                && shard.shape.len() == entry.global_shape.len()
                && (0..shard.shape.len()).all(|d| {
                    shard.offset[d].checked_add(shard.shape[d]).is_some_and(|end| end <= entry.global_shape[d])
                });
            if !fits {
                bail!(
                    "{}: shard of `{name}` at {:?} with shape {:?} does not fit its global shape {:?}",
                    self.dir.join(METADATA_FILE).display(),
                    shard.offset,
                    shard.shape,
                    entry.global_shape
                );
            }
            // One shard per file and tensor: two shards naming the same stored tensor would let
            // a small file claim a huge global tensor (and reads allocate for all of it).
            if entry.shards[..i].iter().any(|o| o.file == shard.file && o.key(name) == shard.key(name)) {
                bail!(
                    "{}: `{name}` lists shard file {} twice (corrupted checkpoint metadata)",
                    self.dir.join(METADATA_FILE).display(),
                    shard.file
                );
            }
            for other in &entry.shards[..i] {
                if intersect(&other.offset, &other.shape, &shard.offset, &shard.shape).is_some() {
                    bail!("{}: shards of `{name}` overlap", self.dir.join(METADATA_FILE).display());
                }
            }
            let st = self.safetensors(&shard.file)?;
            let key = shard.key(name);
            let view = st.tensor(key).map_err(|_| {
                anyhow!("{} has no tensor `{key}` although {METADATA_FILE} lists it there", path.display())
            })?;
            let stored = format!("{:?}", view.dtype());
            if stored != dtype.safetensors_name() || view.shape() != shard.shape.as_slice() {
                bail!(
                    "{}: tensor `{name}` is {stored} {:?}, but {METADATA_FILE} says {} {:?} (corrupted checkpoint)",
                    path.display(),
                    view.shape(),
                    entry.dtype,
                    shard.shape
                );
            }
            covered += volume(&shard.shape);
        }
        let Some(total) = checked_volume(&entry.global_shape) else {
            bail!(
                "{}: global shape {:?} of `{name}` overflows (corrupted checkpoint metadata)",
                self.dir.join(METADATA_FILE).display(),
                entry.global_shape
            );
        };
        if covered != total {
            bail!(
                "{}: the shards of `{name}` cover {covered} of {total} elements (incomplete checkpoint)",
                self.dir.join(METADATA_FILE).display(),
            );
        }
        Ok(())
    }
}

/// `buf` as `to`: unchanged when equal, through f32 between float types, else an error.
fn convert(buf: HostBuffer, to: DType, name: &str) -> Result<HostBuffer> {
    if buf.dtype() == to {
        return Ok(buf);
    }
    if !(buf.dtype().is_float() && to.is_float()) {
        bail!("checkpoint stores `{name}` as {}, the model holds it as {to}: cannot convert", buf.dtype());
    }
    let v = buf.to_f32_vec();
    Ok(match to {
        DType::F32 => HostBuffer::F32(v),
        DType::BF16 => HostBuffer::BF16(v.into_iter().map(bf16::from_f32).collect()),
        DType::F16 => HostBuffer::F16(v.into_iter().map(f16::from_f32).collect()),
        _ => unreachable!("checked is_float above"),
    })
}

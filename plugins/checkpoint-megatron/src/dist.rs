//! Reading Megatron-Core's `torch_dist` checkpoints (SPEC §7.5) — the model weights and the
//! common state (args, iteration, scheduler).
//!
//! An iteration directory holds `metadata.json` (`sharded_backend: torch_dist`), `.metadata`
//! (torch.distributed.checkpoint's pickled `Metadata`: for every key its global size and the
//! chunks — offsets and sizes — it was written in, and for every chunk the `.distcp` file,
//! byte offset and length of its item) and `__R_I.distcp` files whose items are `torch.save`
//! archives of one tensor chunk each. The common state is `common.pt`, or (newer Megatron-Core)
//! the bytes item `common_state/…`. Homogeneous layer stacks are one global tensor with a
//! leading layer axis (`decoder.layers.self_attention.linear_qkv.weight`: `[L, (np+2ng)hn, h]`);
//! tensor-parallel shards are chunks of the full tensor, so a key's chunks tile exactly the
//! tensor megatron-rs stores (fc1 of SwiGLU as `[gate; up]`, as megatron-rs does).

use crate::layout::{iteration_dir_name, read_tracker, Tracked, TRACKER};
use crate::partition::{check_complete, is_known, normalize_name, Shape};
use crate::pickle::unpickle;
use crate::torchzip::{TensorData, TorchFile};
use crate::value::{TorchDType, Value};
use anyhow::{anyhow, bail, Context, Result};
use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// Largest `.metadata` decoded (a 70B model's is a few MiB).
const MAX_METADATA_BYTES: u64 = 1 << 28;

/// Where one chunk's item lies: `.distcp` file (relative), byte offset, length.
#[derive(Clone, Debug)]
struct Item {
    file: String,
    offset: u64,
    length: u64,
}

/// One global tensor of the checkpoint: dtype, size and its chunks `(offsets, sizes)`.
#[derive(Clone, Debug)]
pub struct GlobalTensor {
    pub dtype: TorchDType,
    pub size: Vec<usize>,
    pub chunks: Vec<(Vec<usize>, Vec<usize>)>,
}

/// An opened `torch_dist` checkpoint (tensor data not read yet).
pub struct DistCheckpoint {
    pub iter_dir: PathBuf,
    pub tracked: Tracked,
    /// The common state dict (args, iteration, opt_param_scheduler, …).
    pub common: Value,
    pub args: Value,
    /// The model shape from `args` (its tp/pp are the saving run's; the data are unsharded).
    pub shape: Shape,
    /// Every tensor key of `.metadata`.
    pub tensors: BTreeMap<String, GlobalTensor>,
    items: HashMap<(String, Vec<usize>), Item>,
    bytes_items: BTreeMap<String, Item>,
}

fn usizes(v: Option<&Value>, what: &str) -> Result<Vec<usize>> {
    v.and_then(Value::elements)
        .ok_or_else(|| anyhow!("{what} is not a list of integers"))?
        .iter()
        .map(|x| x.as_i64().filter(|&i| i >= 0).map(|i| i as usize).ok_or_else(|| anyhow!("{what}: bad integer")))
        .collect()
}

fn class_of(v: &Value) -> &str {
    match v {
        Value::Object { class, .. } => class.rsplit('.').next().unwrap_or(class),
        _ => "",
    }
}

/// The dataclass fields of a `.metadata` record.
fn field<'a>(v: &'a Value, name: &str, what: &str) -> Result<&'a Value> {
    v.get(name).ok_or_else(|| anyhow!("{what}: a {} record has no `{name}`", class_of(v)))
}

impl DistCheckpoint {
    /// The iteration (0 for `release`).
    pub fn iteration(&self) -> u64 {
        match self.tracked {
            Tracked::Iteration(i) => i,
            Tracked::Release => 0,
        }
    }

    /// The scheduler state in the common state, if any.
    pub fn scheduler_state(&self) -> Option<&Value> {
        self.common.get("opt_param_scheduler").or_else(|| self.common.get("lr_scheduler"))
    }

    fn read_item(&self, item: &Item, what: &str) -> Result<Vec<u8>> {
        if item.file.contains('/') || item.file.contains("..") || !item.file.ends_with(".distcp") {
            bail!("{}: {what} names file `{}`, not a .distcp of this directory", self.iter_dir.display(), item.file);
        }
        let path = self.iter_dir.join(&item.file);
        let mut f = std::fs::File::open(&path).with_context(|| format!("cannot open {} ({what})", path.display()))?;
        let len = f.metadata().with_context(|| format!("cannot stat {}", path.display()))?.len();
        if item.offset.checked_add(item.length).is_none_or(|end| end > len) {
            bail!(
                "{}: {what} lies at bytes {}..+{} but the file is {len} bytes (truncated?)",
                path.display(),
                item.offset,
                item.length
            );
        }
        let mut buf = vec![0u8; item.length as usize];
        f.seek(SeekFrom::Start(item.offset))
            .and_then(|_| f.read_exact(&mut buf))
            .with_context(|| format!("reading {what} from {}", path.display()))?;
        Ok(buf)
    }

    /// The full tensor stored under `key` (all its chunks placed).
    pub fn global_tensor(&self, key: &str) -> Result<TensorData> {
        let t = self.tensors.get(key).ok_or_else(|| anyhow!("{}: no tensor `{key}`", self.iter_dir.display()))?;
        let numel = t.size.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        let el = t.dtype.size();
        let total =
            numel.and_then(|n| n.checked_mul(el)).ok_or_else(|| anyhow!("`{key}`: size {:?} overflows", t.size))?;
        let mut budget = 0u64;
        let mut covered = 0usize;
        for (off, sz) in &t.chunks {
            if off.len() != t.size.len() || sz.len() != t.size.len() {
                bail!("`{key}`: a chunk's rank differs from the tensor's {:?}", t.size);
            }
            if off.iter().zip(sz).zip(&t.size).any(|((&o, &s), &d)| o.checked_add(s).is_none_or(|e| e > d)) {
                bail!("`{key}`: chunk at {off:?} of size {sz:?} lies outside {:?}", t.size);
            }
            covered += sz.iter().product::<usize>();
            let item = self.items.get(&(key.to_string(), off.clone())).ok_or_else(|| {
                anyhow!("{}: `.metadata` has no storage entry for `{key}` at {off:?}", self.iter_dir.display())
            })?;
            budget += item.length;
        }
        // Chunks tile the tensor (only replica 0 writes), and every item holds its chunk's
        // bytes: a size the items cannot back is a corrupt `.metadata`, not an allocation.
        if covered != numel.unwrap_or(0) || total as u64 > budget {
            bail!("`{key}`: its chunks cover {covered} of {:?} elements (a chunk is missing or overlaps)", t.size);
        }
        let mut out = vec![0u8; total];
        for (off, sz) in &t.chunks {
            let item = &self.items[&(key.to_string(), off.clone())];
            let what = format!("chunk {off:?} of `{key}`");
            let file = TorchFile::from_bytes(self.read_item(item, &what)?, &self.iter_dir.join(&item.file))?;
            let Value::Tensor(r) = &file.root else { bail!("{what} is a {}, not a tensor", file.root.kind()) };
            let chunk = file.tensor(r, key)?;
            if chunk.shape != *sz || chunk.dtype != t.dtype {
                bail!("{what}: item holds {:?} {:?}, `.metadata` says {sz:?} {:?}", chunk.dtype, chunk.shape, t.dtype);
            }
            place(&mut out, &t.size, &chunk.bytes, off, sz, el);
        }
        Ok(TensorData { dtype: t.dtype, shape: t.size.clone(), bytes: out })
    }

    /// Every model tensor, full size, under its megatron-rs name (layer stacks unstacked).
    pub fn full_tensors(&self, progress: &mut dyn FnMut(usize, usize)) -> Result<BTreeMap<String, TensorData>> {
        let keys: Vec<&String> = self
            .tensors
            .keys()
            .filter(|k| ["embedding.", "decoder.", "output_layer."].iter().any(|p| k.starts_with(p)))
            .collect();
        let mut out = BTreeMap::new();
        for (n, key) in keys.iter().enumerate() {
            let full = self.global_tensor(key)?;
            let rest = key.strip_prefix("decoder.layers.");
            let stacked = rest.is_some_and(|r| !r.split('.').next().unwrap_or("").bytes().all(|b| b.is_ascii_digit()));
            if let (true, Some(tail)) = (stacked, rest) {
                let layers = full.shape[0];
                if layers != self.shape.num_layers {
                    bail!("`{key}` stacks {layers} layers, args say num_layers {}", self.shape.num_layers);
                }
                let per = full.bytes.len() / layers.max(1);
                for i in 0..layers {
                    let name = normalize_name(&format!("decoder.layers.{i}.{tail}"));
                    is_known(&name).with_context(|| format!("tensor `{key}`"))?;
                    let bytes = full.bytes[i * per..(i + 1) * per].to_vec();
                    out.insert(name, TensorData { dtype: full.dtype, shape: full.shape[1..].to_vec(), bytes });
                }
            } else {
                let name = normalize_name(key);
                if name == "output_layer.weight" && !self.shape.untied {
                    continue;
                }
                is_known(&name).with_context(|| format!("tensor `{key}`"))?;
                out.insert(name, full);
            }
            progress(n + 1, keys.len());
        }
        check_complete(&out, &self.shape, &self.iter_dir)?;
        Ok(out)
    }
}

/// Copies a row-major chunk of `sz` elements at `off` into the row-major `dst` of `size`.
fn place(dst: &mut [u8], size: &[usize], src: &[u8], off: &[usize], sz: &[usize], el: usize) {
    let nd = size.len();
    if nd == 0 {
        dst.copy_from_slice(&src[..el]);
        return;
    }
    let row = sz[nd - 1] * el;
    let rows: usize = sz[..nd - 1].iter().product();
    let mut idx = vec![0usize; nd - 1];
    for r in 0..rows {
        let mut at = 0usize;
        for d in 0..nd - 1 {
            at = at * size[d] + off[d] + idx[d];
        }
        at = (at * size[nd - 1] + off[nd - 1]) * el;
        dst[at..at + row].copy_from_slice(&src[r * row..(r + 1) * row]);
        for d in (0..nd - 1).rev() {
            idx[d] += 1;
            if idx[d] < sz[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}

/// Opens a `torch_dist` checkpoint under `dir` (a `--save` directory) at the tracker's
/// iteration, or at `step`.
pub fn open(dir: &Path, step: Option<u64>) -> Result<DistCheckpoint> {
    let tracked = match step {
        Some(i) => Tracked::Iteration(i),
        None => read_tracker(dir)?.ok_or_else(|| anyhow!("{} has no {TRACKER}", dir.display()))?,
    };
    let iter_dir = dir.join(iteration_dir_name(tracked));
    let meta_json = iter_dir.join("metadata.json");
    let text = std::fs::read_to_string(&meta_json).with_context(|| format!("cannot read {}", meta_json.display()))?;
    let j: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{} is not JSON", meta_json.display()))?;
    if j["sharded_backend"] != "torch_dist" {
        bail!("{}: sharded_backend is {}, megatron-rs reads torch_dist", meta_json.display(), j["sharded_backend"]);
    }
    let md_path = iter_dir.join(".metadata");
    let len = std::fs::metadata(&md_path).with_context(|| format!("cannot read {}", md_path.display()))?.len();
    if len > MAX_METADATA_BYTES {
        bail!("{} is {len} bytes, larger than any real checkpoint's", md_path.display());
    }
    let bytes = std::fs::read(&md_path).with_context(|| format!("cannot read {}", md_path.display()))?;
    let md = unpickle(&bytes, &md_path.display().to_string())?;
    parse(dir, iter_dir, tracked, &md).with_context(|| format!("{}", md_path.display()))
}

fn parse(dir: &Path, iter_dir: PathBuf, tracked: Tracked, md: &Value) -> Result<DistCheckpoint> {
    if class_of(md) != "Metadata" {
        bail!("not torch.distributed.checkpoint Metadata (a {})", md.kind());
    }
    let mut tensors = BTreeMap::new();
    let mut bytes_keys = Vec::new();
    for (k, v) in field(md, "state_dict_metadata", "Metadata")?.items().unwrap_or(&[]) {
        let key = k.as_str().ok_or_else(|| anyhow!("a state_dict_metadata key is a {}", k.kind()))?.to_string();
        match class_of(v) {
            "BytesStorageMetadata" => bytes_keys.push(key),
            "TensorStorageMetadata" => {
                let props = field(v, "properties", &key)?;
                let dtype = match props {
                    Value::Object { state, .. } => state.elements().and_then(|s| s.first()).cloned(),
                    _ => None,
                }
                .or_else(|| props.get("dtype").cloned());
                let dtype = match dtype {
                    Some(Value::Global { module, name }) if module == "torch" => TorchDType::from_dtype_name(&name)
                        .ok_or_else(|| anyhow!("`{key}`: unsupported dtype torch.{name}"))?,
                    other => bail!("`{key}`: no dtype in its properties ({other:?})"),
                };
                let size = usizes(Some(field(v, "size", &key)?), &format!("`{key}` size"))?;
                let mut chunks = Vec::new();
                for c in field(v, "chunks", &key)?.elements().unwrap_or(&[]) {
                    chunks.push((
                        usizes(c.get("offsets"), &format!("`{key}` chunk offsets"))?,
                        usizes(c.get("sizes"), &format!("`{key}` chunk sizes"))?,
                    ));
                }
                tensors.insert(key, GlobalTensor { dtype, size, chunks });
            }
            other => bail!("`{key}` has storage metadata of class `{other}`"),
        }
    }
    let mut items = HashMap::new();
    let mut bytes_items = BTreeMap::new();
    for (k, v) in field(md, "storage_data", "Metadata")?.items().unwrap_or(&[]) {
        let fqn =
            field(k, "fqn", "MetadataIndex")?.as_str().ok_or_else(|| anyhow!("MetadataIndex.fqn is not a string"))?;
        let item = Item {
            file: field(v, "relative_path", "_StorageInfo")?.as_str().unwrap_or_default().to_string(),
            offset: field(v, "offset", "_StorageInfo")?.as_i64().filter(|&o| o >= 0).unwrap_or(-1i64) as u64,
            length: field(v, "length", "_StorageInfo")?.as_i64().filter(|&o| o >= 0).unwrap_or(-1i64) as u64,
        };
        match k.get("offset") {
            Some(Value::None) | None => {
                bytes_items.insert(fqn.to_string(), item);
            }
            off => {
                items.insert((fqn.to_string(), usizes(off, "MetadataIndex.offset")?), item);
            }
        }
    }
    let mut ck = DistCheckpoint {
        iter_dir: iter_dir.clone(),
        tracked,
        common: Value::None,
        args: Value::None,
        shape: Shape::default(),
        tensors,
        items,
        bytes_items,
    };
    let common_pt = iter_dir.join("common.pt");
    ck.common = if common_pt.exists() {
        TorchFile::open(&common_pt)?.root
    } else {
        let key = bytes_keys.iter().find(|k| k.starts_with("common_state")).ok_or_else(|| {
            anyhow!("{}: no common.pt and no common_state item: cannot read args", iter_dir.display())
        })?;
        let item = ck.bytes_items.get(key).cloned().ok_or_else(|| anyhow!("no storage entry for `{key}`"))?;
        let blob = ck.read_item(&item, key)?;
        // Saved as a sharded object: a one-element list holding the common dict.
        match TorchFile::from_bytes(blob, &iter_dir.join(&item.file))?.root {
            Value::List(mut v) if v.len() == 1 => v.remove(0),
            other => other,
        }
    };
    ck.args =
        ck.common.get("args").cloned().ok_or_else(|| anyhow!("{}: the common state has no `args`", dir.display()))?;
    ck.shape = Shape::from_args(&ck.args, &iter_dir)?;
    Ok(ck)
}

//! Writing `torch.save` files that Megatron-LM's `load_checkpoint` accepts: a pickle (protocol
//! 2, as torch writes) of plain dicts, lists, scalars, an `argparse.Namespace` for `args`, and
//! tensors as `torch._utils._rebuild_tensor_v2` over persistent-id storages, in a zip of STORED
//! entries (`archive/data.pkl`, `archive/data/N` 64-byte aligned, `archive/byteorder`,
//! `archive/version`). Files are written to a temporary name, synced, then renamed.

use crate::torchzip::TensorData;
use crate::value::TorchDType;
use anyhow::{Context, Result};
use std::io::Write;
use std::path::Path;
use zip::write::SimpleFileOptions;

/// What the writer can store.
#[derive(Clone, Debug)]
pub enum Out {
    None,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    List(Vec<Out>),
    Tuple(Vec<Out>),
    Dict(Vec<(String, Out)>),
    /// `argparse.Namespace(**attrs)`.
    Namespace(Vec<(String, Out)>),
    /// `torch.<dtype>` (e.g. `params_dtype`).
    TorchDType(&'static str),
    Tensor(TensorData),
    /// A dict with integer keys (torch's optimizer `state`).
    IntDict(Vec<(i64, Out)>),
}

impl Out {
    /// Plain JSON data as writer values (`"torch.float32"` strings become torch dtypes).
    pub fn from_json(v: &serde_json::Value) -> Out {
        use serde_json::Value as J;
        match v {
            J::Null => Out::None,
            J::Bool(b) => Out::Bool(*b),
            J::Number(n) => n.as_i64().map(Out::Int).unwrap_or_else(|| Out::Float(n.as_f64().unwrap_or(0.0))),
            J::String(s) => match s.as_str() {
                "torch.float32" => Out::TorchDType("float32"),
                "torch.bfloat16" => Out::TorchDType("bfloat16"),
                "torch.float16" => Out::TorchDType("float16"),
                _ => Out::Str(s.clone()),
            },
            J::Array(a) => Out::List(a.iter().map(Out::from_json).collect()),
            J::Object(m) => Out::Dict(m.iter().map(|(k, v)| (k.clone(), Out::from_json(v))).collect()),
        }
    }
}

struct Pickler {
    out: Vec<u8>,
    storages: Vec<(TorchDType, Vec<u8>)>,
}

impl Pickler {
    fn global(&mut self, module: &str, name: &str) {
        self.out.push(b'c');
        self.out.extend_from_slice(module.as_bytes());
        self.out.push(b'\n');
        self.out.extend_from_slice(name.as_bytes());
        self.out.push(b'\n');
    }

    fn str(&mut self, s: &str) {
        self.out.push(b'X');
        self.out.extend_from_slice(&(s.len() as u32).to_le_bytes());
        self.out.extend_from_slice(s.as_bytes());
    }

    fn int(&mut self, i: i64) {
        if (0..256).contains(&i) {
            self.out.extend_from_slice(&[b'K', i as u8]);
        } else if (i32::MIN as i64..=i32::MAX as i64).contains(&i) {
            self.out.push(b'J');
            self.out.extend_from_slice(&(i as i32).to_le_bytes());
        } else {
            self.out.extend_from_slice(&[0x8a, 8]);
            self.out.extend_from_slice(&i.to_le_bytes());
        }
    }

    fn dict(&mut self, items: &[(String, Out)]) {
        self.out.push(b'}');
        if !items.is_empty() {
            self.out.push(b'(');
            for (k, v) in items {
                self.str(k);
                self.value(v);
            }
            self.out.push(b'u');
        }
    }

    fn seq(&mut self, items: &[Out]) {
        self.out.push(b'(');
        for v in items {
            self.value(v);
        }
    }

    fn value(&mut self, v: &Out) {
        match v {
            Out::None => self.out.push(b'N'),
            Out::Bool(b) => self.out.push(if *b { 0x88 } else { 0x89 }),
            Out::Int(i) => self.int(*i),
            Out::Float(f) => {
                self.out.push(b'G');
                self.out.extend_from_slice(&f.to_be_bytes());
            }
            Out::Str(s) => self.str(s),
            Out::List(items) => {
                self.out.push(b']');
                if !items.is_empty() {
                    self.seq(items);
                    self.out.push(b'e');
                }
            }
            Out::Tuple(items) => {
                self.seq(items);
                self.out.push(b't');
            }
            Out::Dict(items) => self.dict(items),
            Out::IntDict(items) => {
                self.out.push(b'}');
                if !items.is_empty() {
                    self.out.push(b'(');
                    for (k, v) in items {
                        self.int(*k);
                        self.value(v);
                    }
                    self.out.push(b'u');
                }
            }
            Out::Namespace(items) => {
                self.global("argparse", "Namespace");
                self.out.extend_from_slice(b")\x81");
                self.dict(items);
                self.out.push(b'b');
            }
            Out::TorchDType(name) => self.global("torch", name),
            Out::Tensor(t) => {
                let key = self.storages.len();
                self.storages.push((t.dtype, t.bytes.clone()));
                self.global("torch._utils", "_rebuild_tensor_v2");
                self.out.push(b'(');
                // Persistent id ('storage', torch.XStorage, key, 'cpu', numel).
                self.out.push(b'(');
                self.str("storage");
                self.global("torch", t.dtype.storage_class());
                self.str(&key.to_string());
                self.str("cpu");
                self.int(t.numel() as i64);
                self.out.extend_from_slice(b"tQ");
                self.int(0);
                let shape: Vec<Out> = t.shape.iter().map(|&s| Out::Int(s as i64)).collect();
                let mut stride = vec![1i64; t.shape.len()];
                for d in (0..t.shape.len().saturating_sub(1)).rev() {
                    stride[d] = stride[d + 1] * t.shape[d + 1] as i64;
                }
                self.value(&Out::Tuple(shape));
                self.value(&Out::Tuple(stride.into_iter().map(Out::Int).collect()));
                self.out.push(0x89); // requires_grad False
                self.global("collections", "OrderedDict");
                self.out.extend_from_slice(b")R"); // backward hooks: OrderedDict()
                self.out.extend_from_slice(b"tR");
            }
        }
    }
}

/// The pickle bytes of `root` and the storages it references, in key order.
pub fn pickle(root: &Out) -> (Vec<u8>, Vec<(TorchDType, Vec<u8>)>) {
    let mut p = Pickler { out: vec![0x80, 2], storages: Vec::new() };
    p.value(root);
    p.out.push(b'.');
    (p.out, p.storages)
}

/// Writes `root` to `path` as `torch.save` does (atomically: temp file, fsync, rename).
pub fn torch_save(root: &Out, path: &Path) -> Result<()> {
    let (pkl, storages) = pickle(root);
    let dir = path.parent().context("torch_save needs a file path")?;
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let tmp = path.with_extension("pt.tmp");
    let file = std::fs::File::create(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
    let mut z = zip::ZipWriter::new(file);
    let stored = SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    let err = |e: zip::result::ZipError| anyhow::anyhow!("writing {}: {e}", tmp.display());
    z.start_file("archive/data.pkl", stored).map_err(err)?;
    z.write_all(&pkl)?;
    z.start_file("archive/byteorder", stored).map_err(err)?;
    z.write_all(b"little")?;
    for (key, (_, bytes)) in storages.iter().enumerate() {
        z.start_file(format!("archive/data/{key}"), stored.with_alignment(64)).map_err(err)?;
        z.write_all(bytes)?;
    }
    z.start_file("archive/version", stored).map_err(err)?;
    z.write_all(b"3\n")?;
    let file = z.finish().map_err(err)?;
    file.sync_all().with_context(|| format!("cannot sync {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot rename {} to {}", tmp.display(), path.display()))
}

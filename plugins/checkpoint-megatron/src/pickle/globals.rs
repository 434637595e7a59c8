//! The globals a pickle may name (an allow-list; everything else is refused) and the
//! constructors of allowed globals, emulated as inert [`Value`]s: tensors from
//! `_rebuild_tensor_v2`, ordered dicts, `Namespace`/enum records.

use super::objects::{freeze, leaf, Instance, Obj};
use super::Machine;
use crate::value::{StorageRef, TensorRef, TorchDType, Value};
use anyhow::{anyhow, bail, Result};
use std::cell::RefCell;
use std::rc::Rc;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum GlobalKind {
    OrderedDict,
    RebuildTensorV2,
    RebuildTensor,
    RebuildParameter,
    CodecsEncode,
    Set,
    Bytearray,
    TorchSize,
    /// A class whose instances we keep as inert records (Namespace, enums, numpy).
    Record,
    /// A value (dtype, storage class): not callable.
    Value,
}

/// The allow-list. Everything else in a pickle is refused.
fn resolve_global(module: &str, name: &str) -> Option<GlobalKind> {
    use GlobalKind::*;
    Some(match (module, name) {
        ("collections", "OrderedDict") => OrderedDict,
        ("torch._utils", "_rebuild_tensor_v2") => RebuildTensorV2,
        ("torch._utils", "_rebuild_tensor") => RebuildTensor,
        ("torch._utils", "_rebuild_parameter") | ("torch._utils", "_rebuild_parameter_with_state") => RebuildParameter,
        ("_codecs", "encode") => CodecsEncode,
        ("builtins", "set") | ("builtins", "frozenset") | ("__builtin__", "set") => Set,
        ("builtins", "bytearray") | ("__builtin__", "bytearray") => Bytearray,
        ("torch", "Size") => TorchSize,
        ("argparse", "Namespace") => Record,
        // `args.exit_signal` is a `signal.Signals` member.
        ("signal", "Signals") => Record,
        ("numpy.core.multiarray", "_reconstruct")
        | ("numpy._core.multiarray", "_reconstruct")
        | ("numpy.core.multiarray", "scalar")
        | ("numpy._core.multiarray", "scalar")
        | ("numpy", "ndarray")
        | ("numpy", "dtype") => Record,
        // torch.distributed.checkpoint's `.metadata` (torch_dist checkpoints): plain dataclasses.
        (
            "torch.distributed.checkpoint.metadata",
            "Metadata" | "TensorStorageMetadata" | "ChunkStorageMetadata" | "TensorProperties" | "BytesStorageMetadata"
            | "StorageMeta" | "MetadataIndex" | "_MEM_FORMAT_ENCODING",
        )
        | ("torch.distributed.checkpoint.filesystem", "_StorageInfo")
        // Megatron-Core keeps the save plans in `.metadata` (`all_local_plans`), for reuse.
        | (
            "torch.distributed.checkpoint.planner",
            "SavePlan" | "WriteItem" | "WriteItemType" | "TensorWriteData" | "BytesIOWriteData",
        )
        // `TensorProperties.layout`: `_get_layout("torch.strided")` looks a layout up by name.
        | ("torch.serialization", "_get_layout") => Record,
        ("torch", "strided") => Value,
        ("torch", n) if TorchDType::from_storage_class(n).is_some() => Value,
        ("torch", n) if is_torch_dtype(n) => Value,
        // Megatron's enums (AttnBackend, ModelType, RerunMode …) as they appear in `args`.
        (m, _) if m.starts_with("megatron.") && (m.ends_with(".enums") || m.ends_with("rerun_state_machine")) => Record,
        _ => return None,
    })
}

fn is_torch_dtype(n: &str) -> bool {
    matches!(
        n,
        "float32" | "float16" | "bfloat16" | "float64" | "int64" | "int32" | "int16" | "int8" | "uint8" | "bool"
    )
}

impl Machine<'_> {
    pub(super) fn global(&self, module: String, name: String) -> Result<Obj> {
        match resolve_global(&module, &name) {
            Some(_) => Ok(leaf(Value::Global { module, name })),
            None => bail!(
                "refusing global `{module}.{name}`: megatron-rs only rebuilds tensors, plain containers and \
                 argparse/enum records from checkpoints and never runs code; re-save the checkpoint without \
                 this object"
            ),
        }
    }

    pub(super) fn append(&mut self, items: Vec<Obj>, at: usize) -> Result<()> {
        match self.top()? {
            Obj::List(l) => {
                l.borrow_mut().extend(items);
                Ok(())
            }
            _ => bail!("APPEND(S) at byte {at} on something that is not a list"),
        }
    }

    pub(super) fn set_items(&mut self, items: Vec<Obj>, at: usize) -> Result<()> {
        let target = self.top()?.clone();
        let dict = match &target {
            Obj::Dict(d) => d.clone(),
            // OrderedDict / Namespace records are filled like dicts into their state.
            Obj::Instance(i) => match &i.borrow().state {
                Obj::Dict(d) => d.clone(),
                _ => bail!("SETITEM(S) at byte {at} on a record without a dict state"),
            },
            _ => bail!("SETITEM(S) at byte {at} on something that is not a dict"),
        };
        let mut it = items.into_iter();
        let mut d = dict.borrow_mut();
        while let (Some(k), Some(v)) = (it.next(), it.next()) {
            d.push((k, v));
        }
        Ok(())
    }

    pub(super) fn call(&self, callable: &Obj, args: Vec<Obj>) -> Result<Obj> {
        let (module, name) = match callable {
            Obj::Leaf(v) => match &**v {
                Value::Global { module, name } => (module.clone(), name.clone()),
                other => bail!("call of a {} (only allowed globals are callable)", other.kind()),
            },
            _ => bail!("call of a container (only allowed globals are callable)"),
        };
        let kind = resolve_global(&module, &name).ok_or_else(|| anyhow!("global `{module}.{name}` not allowed"))?;
        let frozen = || -> Result<Vec<Value>> {
            let mut budget = 1_000_000;
            args.iter().map(|a| freeze(a, 0, &mut budget)).collect()
        };
        Ok(match kind {
            GlobalKind::OrderedDict => {
                let d = Obj::Dict(Rc::default());
                if let Some(Obj::List(pairs)) = args.first() {
                    for p in pairs.borrow().iter() {
                        if let Obj::Tuple(kv) = p {
                            if let [k, v] = kv.as_slice() {
                                if let Obj::Dict(dd) = &d {
                                    dd.borrow_mut().push((k.clone(), v.clone()));
                                }
                            }
                        }
                    }
                }
                d
            }
            GlobalKind::RebuildTensorV2 | GlobalKind::RebuildTensor => {
                leaf(Value::Tensor(tensor_from_args(&frozen()?)?))
            }
            GlobalKind::RebuildParameter => {
                args.into_iter().next().ok_or_else(|| anyhow!("_rebuild_parameter without arguments"))?
            }
            GlobalKind::CodecsEncode => {
                let a = frozen()?;
                match a.first() {
                    Some(Value::Str(s)) => leaf(Value::Bytes(s.chars().map(|c| c as u32 as u8).collect())),
                    _ => bail!("_codecs.encode expects a string"),
                }
            }
            GlobalKind::Set | GlobalKind::TorchSize => match args.into_iter().next() {
                Some(Obj::List(l)) => Obj::List(l),
                Some(Obj::Tuple(t)) => Obj::Tuple(t),
                None => Obj::List(Rc::default()),
                Some(_) => bail!("{module}.{name} expects a sequence"),
            },
            GlobalKind::Bytearray => {
                let a = frozen()?;
                match a.first() {
                    Some(Value::Bytes(b)) => leaf(Value::Bytes(b.clone())),
                    Some(Value::Str(s)) => leaf(Value::Bytes(s.chars().map(|c| c as u32 as u8).collect())),
                    None => leaf(Value::Bytes(Vec::new())),
                    _ => bail!("bytearray expects bytes"),
                }
            }
            GlobalKind::Record => {
                let class = format!("{module}.{name}");
                // A Namespace's attributes arrive by BUILD or SETITEMS: start from an empty dict.
                let state = if name == "Namespace" { Obj::Dict(Rc::default()) } else { leaf(Value::None) };
                Obj::Instance(Rc::new(RefCell::new(Instance { class, args, state })))
            }
            GlobalKind::Value => bail!("`{module}.{name}` is a value, not a constructor"),
        })
    }

    pub(super) fn build(&self, target: &Obj, state: Obj, at: usize) -> Result<()> {
        match target {
            Obj::Instance(i) => {
                let mut inst = i.borrow_mut();
                // Namespace: the state is its attribute dict; merge into what SETITEMS filled.
                if let (Obj::Dict(old), Obj::Dict(new)) = (&inst.state, &state) {
                    if !Rc::ptr_eq(old, new) {
                        let extra = new.borrow().clone();
                        old.borrow_mut().extend(extra);
                    }
                    return Ok(());
                }
                inst.state = state;
                Ok(())
            }
            // An OrderedDict's BUILD state is its instance `__dict__` (a state dict's
            // `_metadata` with module versions), not items: dropped.
            Obj::Dict(_) => Ok(()),
            // `_rebuild_parameter_with_state` / tensor subclasses may BUILD extra attributes.
            Obj::Leaf(v) if matches!(**v, Value::Tensor(_)) => Ok(()),
            _ => bail!("BUILD at byte {at} on a value that has no state"),
        }
    }
}

/// A Python `int` from LONG1/LONG4 little-endian two's complement bytes.
pub(super) fn long_value(bytes: &[u8]) -> Value {
    if bytes.is_empty() {
        return Value::Int(0);
    }
    if bytes.len() <= 8 {
        let neg = bytes[bytes.len() - 1] & 0x80 != 0;
        let mut b = [if neg { 0xff } else { 0 }; 8];
        b[..bytes.len()].copy_from_slice(bytes);
        return Value::Int(i64::from_le_bytes(b));
    }
    Value::BigInt(bytes.to_vec())
}

/// `('storage', torch.FloatStorage, key, location, numel)`.
pub(super) fn storage_from_pid(pid: &Value) -> Result<StorageRef> {
    let parts = match pid {
        Value::Tuple(p) => p,
        other => bail!("persistent id is a {}, expected a ('storage', type, key, location, numel) tuple", other.kind()),
    };
    match parts.as_slice() {
        [Value::Str(tag), Value::Global { module, name }, key, _location, Value::Int(numel)]
            if tag == "storage" && module == "torch" =>
        {
            let dtype =
                TorchDType::from_storage_class(name).ok_or_else(|| anyhow!("unsupported storage type torch.{name}"))?;
            let key = match key {
                Value::Str(s) => s.clone(),
                Value::Int(i) => i.to_string(),
                other => bail!("storage key is a {}", other.kind()),
            };
            if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                bail!("storage key {key:?} is not a plain name");
            }
            if *numel < 0 {
                bail!("storage {key} has a negative size {numel}");
            }
            Ok(StorageRef { key, dtype, numel: *numel as u64 })
        }
        _ => bail!("persistent id {pid} is not a ('storage', torch.<Type>Storage, key, location, numel) tuple"),
    }
}

fn usize_list(v: &Value, what: &str) -> Result<Vec<u64>> {
    let items = v.elements().ok_or_else(|| anyhow!("tensor {what} is a {}, expected a tuple", v.kind()))?;
    items
        .iter()
        .map(|x| match x {
            Value::Int(i) if *i >= 0 => Ok(*i as u64),
            other => bail!("tensor {what} holds {other}, expected non-negative integers"),
        })
        .collect()
}

/// `_rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad, backward_hooks, …)`.
fn tensor_from_args(args: &[Value]) -> Result<TensorRef> {
    let [storage, offset, size, stride, ..] = args else {
        bail!("_rebuild_tensor_v2 with {} arguments (expected at least 4)", args.len());
    };
    let storage = match storage {
        Value::Storage(s) => s.clone(),
        other => bail!("_rebuild_tensor_v2's first argument is a {}, expected a storage", other.kind()),
    };
    let offset = match offset {
        Value::Int(i) if *i >= 0 => *i as u64,
        other => bail!("tensor storage offset {other} is not a non-negative integer"),
    };
    let shape = usize_list(size, "size")?;
    let stride = usize_list(stride, "stride")?;
    if shape.len() != stride.len() {
        bail!("tensor size {shape:?} and stride {stride:?} differ in rank");
    }
    Ok(TensorRef { storage, offset, shape, stride })
}

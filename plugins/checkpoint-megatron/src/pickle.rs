//! A safe unpickler for the pickles `torch.save` writes (protocols 2–5).
//!
//! It is a data decoder, not Python's virtual machine: opcodes build plain containers and
//! scalars; `GLOBAL` is resolved against a small allow-list ([`resolve_global`]) and a call
//! (`REDUCE`/`NEWOBJ`) of an allowed global builds an inert [`Value`] (a tensor reference, an
//! ordered dict, a `Namespace` record). Any other global is refused with an error naming it.
//!
//! Memory: every length read from the input is checked against the bytes left before anything
//! is allocated, the stack and memo grow by at most one entry per opcode, and the final tree is
//! built under a node budget and depth limit, so a shared-reference "bomb" or a cycle is an
//! error rather than an exhaustion.

use crate::value::{StorageRef, TensorRef, TorchDType, Value};
use anyhow::{anyhow, bail, Result};
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

/// Most nodes the output tree may have (a real Megatron state dict has a few thousand).
pub const MAX_NODES: usize = 20_000_000;
/// Deepest nesting of the output tree.
pub const MAX_DEPTH: usize = 200;

/// A class instance under construction (`argparse.Namespace`, enum members, numpy records).
struct Instance {
    class: String,
    args: Vec<Obj>,
    state: Obj,
}

/// The unpickler's working objects: containers are shared and mutable, as in Python, because
/// pickles fill a dict *after* memoizing it.
#[derive(Clone)]
enum Obj {
    Leaf(Rc<Value>),
    List(Rc<RefCell<Vec<Obj>>>),
    Tuple(Rc<Vec<Obj>>),
    Dict(Rc<RefCell<Vec<(Obj, Obj)>>>),
    Instance(Rc<RefCell<Instance>>),
}

fn leaf(v: Value) -> Obj {
    Obj::Leaf(Rc::new(v))
}

/// What an allowed global is: a constructor we emulate, or a plain value.
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

/// Decodes `data` (a whole `data.pkl`). `source` names the file in errors.
pub fn unpickle(data: &[u8], source: &str) -> Result<Value> {
    let mut m = Machine { data, pos: 0, stack: Vec::new(), marks: Vec::new(), memo: HashMap::new() };
    let out = m.run().map_err(|e| anyhow!("{source}: {e}"))?;
    let mut budget = MAX_NODES;
    let value = freeze(&out, 0, &mut budget).map_err(|e| anyhow!("{source}: {e}"));
    // Break reference cycles (a container that contains itself) so nothing leaks.
    for obj in m.memo.values() {
        match obj {
            Obj::List(l) => l.borrow_mut().clear(),
            Obj::Dict(d) => d.borrow_mut().clear(),
            Obj::Instance(i) => i.borrow_mut().state = leaf(Value::None),
            _ => {}
        }
    }
    value
}

struct Machine<'a> {
    data: &'a [u8],
    pos: usize,
    stack: Vec<Obj>,
    marks: Vec<usize>,
    memo: HashMap<u64, Obj>,
}

impl<'a> Machine<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.data.len()).ok_or_else(|| {
            anyhow!("truncated pickle: {n} bytes wanted at byte {}, {} left", self.pos, self.data.len() - self.pos)
        })?;
        let s = &self.data[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }

    fn le<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut b = [0u8; N];
        b.copy_from_slice(self.take(N)?);
        Ok(b)
    }

    /// A length prefix of `n` bytes, checked against the input left.
    fn len(&mut self, n: usize) -> Result<usize> {
        let v = match n {
            1 => u64::from(self.u8()?),
            4 => u64::from(u32::from_le_bytes(self.le()?)),
            _ => u64::from_le_bytes(self.le()?),
        };
        let left = (self.data.len() - self.pos) as u64;
        if v > left {
            bail!("length {v} at byte {} exceeds the {left} bytes left (truncated or corrupted pickle)", self.pos);
        }
        Ok(v as usize)
    }

    fn line(&mut self) -> Result<&'a str> {
        let rest = &self.data[self.pos..];
        let n = rest.iter().position(|&b| b == b'\n').ok_or_else(|| anyhow!("unterminated text line"))?;
        self.pos += n + 1;
        std::str::from_utf8(&rest[..n]).map_err(|_| anyhow!("text line at byte {} is not UTF-8", self.pos))
    }

    fn pop(&mut self) -> Result<Obj> {
        let floor = self.marks.last().copied().unwrap_or(0);
        if self.stack.len() <= floor {
            bail!("stack underflow at byte {}", self.pos);
        }
        Ok(self.stack.pop().expect("checked non-empty"))
    }

    fn top(&self) -> Result<&Obj> {
        let floor = self.marks.last().copied().unwrap_or(0);
        if self.stack.len() <= floor {
            bail!("stack underflow at byte {}", self.pos);
        }
        Ok(self.stack.last().expect("checked non-empty"))
    }

    fn pop_mark(&mut self) -> Result<Vec<Obj>> {
        let m = self.marks.pop().ok_or_else(|| anyhow!("no MARK before byte {}", self.pos))?;
        Ok(self.stack.split_off(m))
    }

    fn memo_get(&self, k: u64) -> Result<Obj> {
        self.memo.get(&k).cloned().ok_or_else(|| anyhow!("memo key {k} read before it was stored"))
    }

    fn memo_put(&mut self, k: u64) -> Result<()> {
        let v = self.top()?.clone();
        self.memo.insert(k, v);
        Ok(())
    }

    fn run(&mut self) -> Result<Obj> {
        loop {
            let at = self.pos;
            let op = self.u8()?;
            match op {
                0x80 => {
                    let v = self.u8()?;
                    if v > 5 {
                        bail!("pickle protocol {v} is newer than 5");
                    }
                }
                0x95 => {
                    self.le::<8>()?; // FRAME: a length hint only.
                }
                b'.' => return self.pop(),
                b'(' => self.marks.push(self.stack.len()),
                b'0' => {
                    self.pop()?;
                }
                b'1' => {
                    self.pop_mark()?;
                }
                b'2' => {
                    let v = self.top()?.clone();
                    self.stack.push(v);
                }
                b'N' => self.stack.push(leaf(Value::None)),
                0x88 => self.stack.push(leaf(Value::Bool(true))),
                0x89 => self.stack.push(leaf(Value::Bool(false))),
                b'J' => {
                    let v = i32::from_le_bytes(self.le()?);
                    self.stack.push(leaf(Value::Int(i64::from(v))));
                }
                b'K' => {
                    let v = self.u8()?;
                    self.stack.push(leaf(Value::Int(i64::from(v))));
                }
                b'M' => {
                    let v = u16::from_le_bytes(self.le()?);
                    self.stack.push(leaf(Value::Int(i64::from(v))));
                }
                0x8a | 0x8b => {
                    let n = self.len(if op == 0x8a { 1 } else { 4 })?;
                    let bytes = self.take(n)?;
                    self.stack.push(leaf(long_value(bytes)));
                }
                b'I' | b'L' => {
                    let line = self.line()?.trim_end_matches('L');
                    let v = match line {
                        "00" => Value::Bool(false),
                        "01" => Value::Bool(true),
                        s => Value::Int(s.parse().map_err(|_| anyhow!("bad integer literal {s:?} at byte {at}"))?),
                    };
                    self.stack.push(leaf(v));
                }
                b'G' => {
                    let v = f64::from_be_bytes(self.le()?);
                    self.stack.push(leaf(Value::Float(v)));
                }
                b'F' => {
                    let s = self.line()?;
                    let f = s.parse().map_err(|_| anyhow!("bad float literal {s:?} at byte {at}"))?;
                    self.stack.push(leaf(Value::Float(f)));
                }
                b'X' | 0x8c | 0x8d => {
                    let n = self.len(match op {
                        0x8c => 1,
                        b'X' => 4,
                        _ => 8,
                    })?;
                    let s = std::str::from_utf8(self.take(n)?)
                        .map_err(|_| anyhow!("string at byte {at} is not valid UTF-8"))?;
                    self.stack.push(leaf(Value::Str(s.to_string())));
                }
                b'T' | b'U' => {
                    // Python 2 str: latin-1 text.
                    let n = self.len(if op == b'U' { 1 } else { 4 })?;
                    let s: String = self.take(n)?.iter().map(|&b| char::from(b)).collect();
                    self.stack.push(leaf(Value::Str(s)));
                }
                b'B' | b'C' | 0x8e | 0x96 => {
                    let n = self.len(match op {
                        b'C' => 1,
                        b'B' => 4,
                        _ => 8,
                    })?;
                    let b = self.take(n)?.to_vec();
                    self.stack.push(leaf(Value::Bytes(b)));
                }
                b'V' => {
                    let s = self.line()?.to_string();
                    self.stack.push(leaf(Value::Str(s)));
                }
                b'S' => {
                    let s = self.line()?;
                    let s = s.trim_matches(|c| c == '\'' || c == '"').to_string();
                    self.stack.push(leaf(Value::Str(s)));
                }
                b'}' => self.stack.push(Obj::Dict(Rc::default())),
                b']' => self.stack.push(Obj::List(Rc::default())),
                b')' => self.stack.push(Obj::Tuple(Rc::new(Vec::new()))),
                0x8f => self.stack.push(Obj::List(Rc::default())), // EMPTY_SET: kept as a list
                b'd' => {
                    let items = self.pop_mark()?;
                    if items.len() % 2 != 0 {
                        bail!("DICT with an odd number of items at byte {at}");
                    }
                    let mut it = items.into_iter();
                    let mut pairs = Vec::new();
                    while let (Some(k), Some(v)) = (it.next(), it.next()) {
                        pairs.push((k, v));
                    }
                    self.stack.push(Obj::Dict(Rc::new(RefCell::new(pairs))));
                }
                b'l' => {
                    let items = self.pop_mark()?;
                    self.stack.push(Obj::List(Rc::new(RefCell::new(items))));
                }
                b't' | 0x91 => {
                    let items = self.pop_mark()?;
                    self.stack.push(Obj::Tuple(Rc::new(items)));
                }
                0x85..=0x87 => {
                    let n = usize::from(op - 0x84);
                    let mut items = Vec::with_capacity(n);
                    for _ in 0..n {
                        items.push(self.pop()?);
                    }
                    items.reverse();
                    self.stack.push(Obj::Tuple(Rc::new(items)));
                }
                b'a' => {
                    let v = self.pop()?;
                    self.append(vec![v], at)?;
                }
                b'e' | 0x90 => {
                    let items = self.pop_mark()?;
                    self.append(items, at)?;
                }
                b's' => {
                    let v = self.pop()?;
                    let k = self.pop()?;
                    self.set_items(vec![k, v], at)?;
                }
                b'u' => {
                    let items = self.pop_mark()?;
                    if items.len() % 2 != 0 {
                        bail!("SETITEMS with an odd number of items at byte {at}");
                    }
                    self.set_items(items, at)?;
                }
                b'q' => {
                    let k = u64::from(self.u8()?);
                    self.memo_put(k)?;
                }
                b'r' => {
                    let k = u64::from(u32::from_le_bytes(self.le()?));
                    self.memo_put(k)?;
                }
                b'p' => {
                    let k = self.line()?.parse().map_err(|_| anyhow!("bad PUT index at byte {at}"))?;
                    self.memo_put(k)?;
                }
                0x94 => {
                    let k = self.memo.len() as u64;
                    self.memo_put(k)?;
                }
                b'h' => {
                    let k = u64::from(self.u8()?);
                    let v = self.memo_get(k)?;
                    self.stack.push(v);
                }
                b'j' => {
                    let k = u64::from(u32::from_le_bytes(self.le()?));
                    let v = self.memo_get(k)?;
                    self.stack.push(v);
                }
                b'g' => {
                    let k = self.line()?.parse().map_err(|_| anyhow!("bad GET index at byte {at}"))?;
                    let v = self.memo_get(k)?;
                    self.stack.push(v);
                }
                b'c' => {
                    let module = self.line()?.to_string();
                    let name = self.line()?.to_string();
                    self.stack.push(self.global(module, name)?);
                }
                0x93 => {
                    let name = self.pop()?;
                    let module = self.pop()?;
                    match (module, name) {
                        (Obj::Leaf(m), Obj::Leaf(n)) => match (&*m, &*n) {
                            (Value::Str(m), Value::Str(n)) => {
                                let g = self.global(m.clone(), n.clone())?;
                                self.stack.push(g);
                            }
                            _ => bail!("STACK_GLOBAL needs two strings at byte {at}"),
                        },
                        _ => bail!("STACK_GLOBAL needs two strings at byte {at}"),
                    }
                }
                b'R' | 0x81 => {
                    let args = self.pop()?;
                    let callable = self.pop()?;
                    let args = match args {
                        Obj::Tuple(t) => t.as_ref().clone(),
                        _ => bail!("call at byte {at} without an argument tuple"),
                    };
                    let out = self.call(&callable, args)?;
                    self.stack.push(out);
                }
                0x92 => {
                    let _kwargs = self.pop()?;
                    let args = self.pop()?;
                    let callable = self.pop()?;
                    let args = match args {
                        Obj::Tuple(t) => t.as_ref().clone(),
                        _ => bail!("NEWOBJ_EX at byte {at} without an argument tuple"),
                    };
                    let out = self.call(&callable, args)?;
                    self.stack.push(out);
                }
                b'b' => {
                    let state = self.pop()?;
                    let target = self.top()?.clone();
                    self.build(&target, state, at)?;
                }
                b'Q' => {
                    let pid = self.pop()?;
                    let mut budget = 64;
                    let pid = freeze(&pid, 0, &mut budget)?;
                    self.stack.push(leaf(Value::Storage(storage_from_pid(&pid)?)));
                }
                b'P' => bail!("text persistent ids (PERSID) are not written by torch.save"),
                other => bail!(
                    "unsupported pickle opcode 0x{other:02x} at byte {at} (not produced by torch.save of a \
                     state dict; refusing to guess)"
                ),
            }
        }
    }

    fn global(&self, module: String, name: String) -> Result<Obj> {
        match resolve_global(&module, &name) {
            Some(_) => Ok(leaf(Value::Global { module, name })),
            None => bail!(
                "refusing global `{module}.{name}`: megatron-rs only rebuilds tensors, plain containers and \
                 argparse/enum records from checkpoints and never runs code; re-save the checkpoint without \
                 this object"
            ),
        }
    }

    fn append(&mut self, items: Vec<Obj>, at: usize) -> Result<()> {
        match self.top()? {
            Obj::List(l) => {
                l.borrow_mut().extend(items);
                Ok(())
            }
            _ => bail!("APPEND(S) at byte {at} on something that is not a list"),
        }
    }

    fn set_items(&mut self, items: Vec<Obj>, at: usize) -> Result<()> {
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

    fn call(&self, callable: &Obj, args: Vec<Obj>) -> Result<Obj> {
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

    fn build(&self, target: &Obj, state: Obj, at: usize) -> Result<()> {
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
fn long_value(bytes: &[u8]) -> Value {
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
fn storage_from_pid(pid: &Value) -> Result<StorageRef> {
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

/// The output tree of `obj`, within `budget` nodes and [`MAX_DEPTH`].
fn freeze(obj: &Obj, depth: usize, budget: &mut usize) -> Result<Value> {
    if depth > MAX_DEPTH {
        bail!("nesting deeper than {MAX_DEPTH} (a reference cycle or a hostile pickle)");
    }
    if *budget == 0 {
        bail!("more than {MAX_NODES} values (shared references expand too far)");
    }
    *budget -= 1;
    let d = depth + 1;
    Ok(match obj {
        Obj::Leaf(v) => (**v).clone(),
        Obj::List(l) => Value::List(l.borrow().iter().map(|x| freeze(x, d, budget)).collect::<Result<_>>()?),
        Obj::Tuple(t) => Value::Tuple(t.iter().map(|x| freeze(x, d, budget)).collect::<Result<_>>()?),
        Obj::Dict(items) => {
            let mut out: Vec<(Value, Value)> = Vec::new();
            let mut index: HashMap<String, usize> = HashMap::new();
            for (k, v) in items.borrow().iter() {
                let (k, v) = (freeze(k, d, budget)?, freeze(v, d, budget)?);
                let key = match &k {
                    Value::Str(s) => Some(format!("s{s}")),
                    Value::Int(i) => Some(format!("i{i}")),
                    _ => None,
                };
                match key.as_ref().and_then(|key| index.get(key)) {
                    Some(&i) => out[i].1 = v,
                    None => {
                        if let Some(key) = key {
                            index.insert(key, out.len());
                        }
                        out.push((k, v));
                    }
                }
            }
            Value::Dict(out)
        }
        Obj::Instance(i) => {
            let inst = i.borrow();
            Value::Object {
                class: inst.class.clone(),
                args: inst.args.iter().map(|x| freeze(x, d, budget)).collect::<Result<_>>()?,
                state: Box::new(freeze(&inst.state, d, budget)?),
            }
        }
    })
}

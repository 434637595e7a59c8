//! A safe unpickler for the pickles `torch.save` writes (protocols 2–5).
//!
//! It is a data decoder, not Python's virtual machine: opcodes build plain containers and
//! scalars; `GLOBAL` is resolved against a small allow-list (`globals::resolve_global`) and a call
//! (`REDUCE`/`NEWOBJ`) of an allowed global builds an inert [`Value`] (a tensor reference, an
//! ordered dict, a `Namespace` record). Any other global is refused with an error naming it.
//!
//! Memory: every length read from the input is checked against the bytes left before anything
//! is allocated, the stack and memo grow by at most one entry per opcode, and the final tree is
//! built under a node budget and depth limit, so a shared-reference "bomb" or a cycle is an
//! error rather than an exhaustion.
//!
//! Files: this one holds the opcode loop; [`objects`] the working objects and the frozen
//! output; [`globals`] the allow-list and the constructors it emulates.

mod globals;
mod objects;

use crate::value::Value;
use anyhow::{anyhow, bail, Result};
use globals::{long_value, storage_from_pid};
use objects::{freeze, leaf, Obj};
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

/// Most nodes the output tree may have (a real Megatron state dict has a few thousand).
pub const MAX_NODES: usize = 20_000_000;
/// Deepest nesting of the output tree.
pub const MAX_DEPTH: usize = 200;

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
}

//! The unpickler's working objects (shared, mutable containers as in Python) and the frozen
//! [`Value`] tree they become, built under a node budget and depth limit.

use super::{MAX_DEPTH, MAX_NODES};
use crate::value::Value;
use anyhow::{bail, Result};
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

/// A class instance under construction (`argparse.Namespace`, enum members, numpy records).
pub(super) struct Instance {
    pub(super) class: String,
    pub(super) args: Vec<Obj>,
    pub(super) state: Obj,
}

/// The unpickler's working objects: containers are shared and mutable, as in Python, because
/// pickles fill a dict *after* memoizing it.
#[derive(Clone)]
pub(super) enum Obj {
    Leaf(Rc<Value>),
    List(Rc<RefCell<Vec<Obj>>>),
    Tuple(Rc<Vec<Obj>>),
    Dict(Rc<RefCell<Vec<(Obj, Obj)>>>),
    Instance(Rc<RefCell<Instance>>),
}

pub(super) fn leaf(v: Value) -> Obj {
    Obj::Leaf(Rc::new(v))
}

/// The output tree of `obj`, within `budget` nodes and [`MAX_DEPTH`].
pub(super) fn freeze(obj: &Obj, depth: usize, budget: &mut usize) -> Result<Value> {
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

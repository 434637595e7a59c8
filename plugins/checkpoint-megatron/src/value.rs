//! The values a safe unpickle produces: plain containers, scalars, tensor references into the
//! archive's storages, and inert records of the few classes we accept (argparse `Namespace`,
//! enums, numpy arrays). Nothing here can run code; it is data only.

use std::fmt;

/// Element type of a torch storage (`torch.FloatStorage` …).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TorchDType {
    F64,
    F32,
    F16,
    BF16,
    I64,
    I32,
    I16,
    I8,
    U8,
    Bool,
}

impl TorchDType {
    /// The dtype of a `torch.<name>` storage class, e.g. `FloatStorage`.
    pub fn from_storage_class(name: &str) -> Option<TorchDType> {
        Some(match name {
            "DoubleStorage" => TorchDType::F64,
            "FloatStorage" => TorchDType::F32,
            "HalfStorage" => TorchDType::F16,
            "BFloat16Storage" => TorchDType::BF16,
            "LongStorage" => TorchDType::I64,
            "IntStorage" => TorchDType::I32,
            "ShortStorage" => TorchDType::I16,
            "CharStorage" => TorchDType::I8,
            "ByteStorage" => TorchDType::U8,
            "BoolStorage" => TorchDType::Bool,
            _ => return None,
        })
    }

    /// The storage class name torch pickles for this dtype.
    pub fn storage_class(self) -> &'static str {
        match self {
            TorchDType::F64 => "DoubleStorage",
            TorchDType::F32 => "FloatStorage",
            TorchDType::F16 => "HalfStorage",
            TorchDType::BF16 => "BFloat16Storage",
            TorchDType::I64 => "LongStorage",
            TorchDType::I32 => "IntStorage",
            TorchDType::I16 => "ShortStorage",
            TorchDType::I8 => "CharStorage",
            TorchDType::U8 => "ByteStorage",
            TorchDType::Bool => "BoolStorage",
        }
    }

    pub fn size(self) -> usize {
        match self {
            TorchDType::F64 | TorchDType::I64 => 8,
            TorchDType::F32 | TorchDType::I32 => 4,
            TorchDType::F16 | TorchDType::BF16 | TorchDType::I16 => 2,
            TorchDType::I8 | TorchDType::U8 | TorchDType::Bool => 1,
        }
    }

    /// The dtype `torch.<name>` names (`float32`, `bfloat16`, …).
    pub fn from_dtype_name(name: &str) -> Option<TorchDType> {
        [
            TorchDType::F64,
            TorchDType::F32,
            TorchDType::F16,
            TorchDType::BF16,
            TorchDType::I64,
            TorchDType::I32,
            TorchDType::I16,
            TorchDType::I8,
            TorchDType::U8,
            TorchDType::Bool,
        ]
        .into_iter()
        .find(|d| d.name() == name)
    }

    pub fn name(self) -> &'static str {
        match self {
            TorchDType::F64 => "float64",
            TorchDType::F32 => "float32",
            TorchDType::F16 => "float16",
            TorchDType::BF16 => "bfloat16",
            TorchDType::I64 => "int64",
            TorchDType::I32 => "int32",
            TorchDType::I16 => "int16",
            TorchDType::I8 => "int8",
            TorchDType::U8 => "uint8",
            TorchDType::Bool => "bool",
        }
    }
}

/// A storage named by a pickle's persistent id: `data/<key>` of the archive.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StorageRef {
    pub key: String,
    pub dtype: TorchDType,
    /// Number of elements the pickle claims; checked against the archive entry's size.
    pub numel: u64,
}

/// A tensor view of a storage (`torch._utils._rebuild_tensor_v2` arguments).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorRef {
    pub storage: StorageRef,
    pub offset: u64,
    pub shape: Vec<u64>,
    pub stride: Vec<u64>,
}

impl TensorRef {
    pub fn numel(&self) -> u64 {
        self.shape.iter().product()
    }
}

/// An unpickled value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    None,
    Bool(bool),
    Int(i64),
    /// An integer that does not fit `i64` (little-endian two's complement bytes, as pickled).
    BigInt(Vec<u8>),
    Float(f64),
    Str(String),
    Bytes(Vec<u8>),
    List(Vec<Value>),
    Tuple(Vec<Value>),
    /// Keys in insertion order, each key once (a later set replaces the value).
    Dict(Vec<(Value, Value)>),
    Tensor(TensorRef),
    Storage(StorageRef),
    /// A reference to an allowed global that is a value, not called (e.g. `torch.float32`).
    Global {
        module: String,
        name: String,
    },
    /// An inert record of an allowed class: `argparse.Namespace` (its attributes in `state`),
    /// enum members (`args`), numpy arrays. Never instantiated.
    Object {
        class: String,
        args: Vec<Value>,
        state: Box<Value>,
    },
}

impl Value {
    /// The value of string key `key` of a dict, or of an object's attribute dict
    /// (`Namespace.key`).
    pub fn get(&self, key: &str) -> Option<&Value> {
        match self {
            Value::Dict(items) => items.iter().find(|(k, _)| matches!(k, Value::Str(s) if s == key)).map(|(_, v)| v),
            Value::Object { state, .. } => state.get(key),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Value::Int(i) => Some(*i),
            Value::Bool(b) => Some(i64::from(*b)),
            _ => None,
        }
    }

    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Value::Float(f) => Some(*f),
            Value::Int(i) => Some(*i as f64),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Value::Bool(b) => Some(*b),
            Value::Int(i) => Some(*i != 0),
            _ => None,
        }
    }

    /// The `(key, value)` pairs of a dict, or of a `Namespace`'s attributes.
    pub fn items(&self) -> Option<&[(Value, Value)]> {
        match self {
            Value::Dict(items) => Some(items),
            Value::Object { state, .. } => state.items(),
            _ => None,
        }
    }

    /// The elements of a list or tuple.
    pub fn elements(&self) -> Option<&[Value]> {
        match self {
            Value::List(v) | Value::Tuple(v) => Some(v),
            _ => None,
        }
    }

    /// A short name of the kind of value, for error messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Value::None => "None",
            Value::Bool(_) => "bool",
            Value::Int(_) | Value::BigInt(_) => "int",
            Value::Float(_) => "float",
            Value::Str(_) => "str",
            Value::Bytes(_) => "bytes",
            Value::List(_) => "list",
            Value::Tuple(_) => "tuple",
            Value::Dict(_) => "dict",
            Value::Tensor(_) => "tensor",
            Value::Storage(_) => "storage",
            Value::Global { .. } => "global",
            Value::Object { .. } => "object",
        }
    }

    /// A JSON rendering of plain data (args, scheduler state); tensors become a description.
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::{json, Value as J};
        match self {
            Value::None => J::Null,
            Value::Bool(b) => json!(b),
            Value::Int(i) => json!(i),
            Value::BigInt(_) => json!(format!("{self}")),
            Value::Float(f) if f.is_finite() => json!(f),
            Value::Float(f) => json!(f.to_string()),
            Value::Str(s) => json!(s),
            Value::Bytes(b) => json!(format!("<{} bytes>", b.len())),
            Value::List(v) | Value::Tuple(v) => J::Array(v.iter().map(Value::to_json).collect()),
            Value::Dict(items) => {
                let mut m = serde_json::Map::new();
                for (k, v) in items {
                    let key = match k {
                        Value::Str(s) => s.clone(),
                        other => other.to_string(),
                    };
                    m.insert(key, v.to_json());
                }
                J::Object(m)
            }
            Value::Tensor(t) => json!(format!("<tensor {} {:?}>", t.storage.dtype.name(), t.shape)),
            Value::Storage(s) => json!(format!("<storage {} {}>", s.dtype.name(), s.numel)),
            Value::Global { module, name } => json!(format!("{module}.{name}")),
            Value::Object { class, args, state } => {
                if class == "argparse.Namespace" {
                    state.to_json()
                } else if matches!(**state, Value::None) && args.len() == 1 {
                    // Enum members: their value.
                    args[0].to_json()
                } else {
                    json!(format!("<{class}>"))
                }
            }
        }
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Str(s) => write!(f, "{s:?}"),
            Value::Int(i) => write!(f, "{i}"),
            Value::BigInt(b) => write!(f, "<int of {} bytes>", b.len()),
            other => write!(f, "{}", other.to_json()),
        }
    }
}

impl Value {
    /// Plain JSON as a value (objects become dicts), e.g. megatron-rs's stored args.
    pub fn from_json(v: &serde_json::Value) -> Value {
        use serde_json::Value as J;
        match v {
            J::Null => Value::None,
            J::Bool(b) => Value::Bool(*b),
            J::Number(n) => n.as_i64().map(Value::Int).unwrap_or_else(|| Value::Float(n.as_f64().unwrap_or(0.0))),
            J::String(s) => Value::Str(s.clone()),
            J::Array(a) => Value::List(a.iter().map(Value::from_json).collect()),
            J::Object(m) => Value::Dict(m.iter().map(|(k, v)| (Value::Str(k.clone()), Value::from_json(v))).collect()),
        }
    }
}

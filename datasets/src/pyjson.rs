//! Python's `json.dumps(obj, indent=4)` byte for byte, for the dataset descriptions whose md5
//! names Megatron's cache files (SPEC §2.5). Python keeps dict insertion order, distinguishes
//! `0` from `0.0`, prints floats with `repr` (shortest round-trip, exponent outside
//! `1e-4 <= |x| < 1e16`) and escapes every non-ASCII character (`ensure_ascii=True`); serde_json
//! does none of these, hence this small writer.

use std::fmt::Write;

/// A JSON value with Python's distinctions.
#[derive(Clone, Debug, PartialEq)]
pub enum PyValue {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    List(Vec<PyValue>),
    /// Keys in insertion order.
    Dict(Vec<(String, PyValue)>),
}

impl PyValue {
    /// A dict from `(key, value)` pairs in order.
    pub fn dict<K: Into<String>>(items: impl IntoIterator<Item = (K, PyValue)>) -> PyValue {
        PyValue::Dict(items.into_iter().map(|(k, v)| (k.into(), v)).collect())
    }

    pub fn str(s: impl Into<String>) -> PyValue {
        PyValue::Str(s.into())
    }

    /// `None` → `null`.
    pub fn opt<T>(v: Option<T>, f: impl FnOnce(T) -> PyValue) -> PyValue {
        v.map_or(PyValue::Null, f)
    }

    /// `json.dumps(self, indent=4)`.
    pub fn dumps_indent4(&self) -> String {
        let mut out = String::new();
        self.write(&mut out, 0);
        out
    }

    fn write(&self, out: &mut String, level: usize) {
        match self {
            PyValue::Null => out.push_str("null"),
            PyValue::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            PyValue::Int(i) => {
                let _ = write!(out, "{i}");
            }
            PyValue::Float(f) => out.push_str(&py_float_repr(*f)),
            PyValue::Str(s) => write_py_string(out, s),
            PyValue::List(items) if items.is_empty() => out.push_str("[]"),
            PyValue::Dict(items) if items.is_empty() => out.push_str("{}"),
            PyValue::List(items) => {
                out.push('[');
                for (i, v) in items.iter().enumerate() {
                    newline(out, level + 1, i > 0);
                    v.write(out, level + 1);
                }
                newline(out, level, false);
                out.push(']');
            }
            PyValue::Dict(items) => {
                out.push('{');
                for (i, (k, v)) in items.iter().enumerate() {
                    newline(out, level + 1, i > 0);
                    write_py_string(out, k);
                    out.push_str(": ");
                    v.write(out, level + 1);
                }
                newline(out, level, false);
                out.push('}');
            }
        }
    }
}

/// Python's item separator with `indent` set is `","` followed by the newline and indent.
fn newline(out: &mut String, level: usize, comma: bool) {
    if comma {
        out.push(',');
    }
    out.push('\n');
    out.extend(std::iter::repeat_n(' ', 4 * level));
}

/// A JSON string as Python writes it with `ensure_ascii=True`.
fn write_py_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            ' '..='~' => out.push(c),
            _ => {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{u:04x}");
                }
            }
        }
    }
    out.push('"');
}

/// Python's `repr(float)` (`float_repr_style == 'short'`); JSON spells non-finite values as
/// `NaN`, `Infinity`, `-Infinity`.
pub fn py_float_repr(x: f64) -> String {
    if x.is_nan() {
        return "NaN".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "Infinity".into() } else { "-Infinity".into() };
    }
    // Rust's `{:e}` gives the shortest round-trip digits, e.g. "9.69e-1", "-1e16".
    let sci = format!("{x:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (sign, mantissa) = mantissa.strip_prefix('-').map_or(("", mantissa), |m| ("-", m));
    let digits: String = mantissa.chars().filter(|c| c.is_ascii_digit()).collect();
    let decpt = exp + 1; // position of the decimal point relative to the digits
    if x == 0.0 {
        return format!("{sign}0.0");
    }
    if !(-4 < decpt && decpt <= 16) {
        let (first, rest) = digits.split_at(1);
        let frac = if rest.is_empty() { String::new() } else { format!(".{rest}") };
        let esign = if exp < 0 { '-' } else { '+' };
        return format!("{sign}{first}{frac}e{esign}{:02}", exp.abs());
    }
    let n = digits.len() as i32;
    if decpt <= 0 {
        format!("{sign}0.{}{digits}", "0".repeat((-decpt) as usize))
    } else if decpt >= n {
        format!("{sign}{digits}{}.0", "0".repeat((decpt - n) as usize))
    } else {
        let (int, frac) = digits.split_at(decpt as usize);
        format!("{sign}{int}.{frac}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_print_as_python_repr() {
        let cases = [
            (0.969, "0.969"),
            (0.03, "0.03"),
            (0.999, "0.999"),
            (1.0, "1.0"),
            (0.1 + 0.2, "0.30000000000000004"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (1.5e16, "1.5e+16"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (-2.5e-7, "-2.5e-07"),
            (123.456, "123.456"),
            (1e100, "1e+100"),
            (-0.0, "-0.0"),
            (1.0 / 3.0, "0.3333333333333333"),
        ];
        for (x, want) in cases {
            assert_eq!(py_float_repr(x), want, "repr({x:?})");
        }
    }

    #[test]
    fn dumps_matches_python_indent_4() {
        let v = PyValue::dict([
            ("class", PyValue::str("GPTDataset")),
            ("num_samples", PyValue::Null),
            (
                "split_matrix",
                PyValue::List(vec![PyValue::List(vec![PyValue::Int(0), PyValue::Float(0.5)]), PyValue::Null]),
            ),
            ("empty", PyValue::List(vec![])),
            ("t", PyValue::dict([("p", PyValue::str("é\"\\\n\u{1F600}"))])),
        ]);
        let want = "{\n    \"class\": \"GPTDataset\",\n    \"num_samples\": null,\n    \"split_matrix\": [\n        [\n            \
                    0,\n            0.5\n        ],\n        null\n    ],\n    \"empty\": [],\n    \"t\": {\n        \
                    \"p\": \"\\u00e9\\\"\\\\\\n\\ud83d\\ude00\"\n    }\n}";
        assert_eq!(v.dumps_indent4(), want);
    }
}

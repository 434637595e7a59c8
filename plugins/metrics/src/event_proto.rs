//! Hand-encoded protobuf for the two TensorBoard messages we write (`tensorflow.Event` and
//! `tensorflow.Summary`), plus a decoder for tests and tools.
//!
//! Fields used (from tensorflow/core/util/event.proto and summary.proto):
//! `Event { double wall_time = 1; int64 step = 2; oneof what { string file_version = 3;
//! Summary summary = 5; } }`, `Summary { repeated Value value = 1; }`,
//! `Value { string tag = 1; float simple_value = 2; }`.

use anyhow::{bail, Result};

const WIRE_VARINT: u8 = 0;
const WIRE_FIXED64: u8 = 1;
const WIRE_LEN: u8 = 2;
const WIRE_FIXED32: u8 = 5;

/// One scalar of a summary.
#[derive(Clone, Debug, PartialEq)]
pub struct ScalarValue {
    pub tag: String,
    pub simple_value: f32,
}

/// A text summary as torch's `SummaryWriter.add_text` writes it: a `Summary.Value` with
/// `metadata.plugin_data.plugin_name = "text"` and a 1-element `DT_STRING` tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct TextValue {
    /// The full tag (`add_text` appends `/text_summary`).
    pub tag: String,
    pub text: String,
}

/// What an event carries.
#[derive(Clone, Debug, PartialEq)]
pub enum EventKind {
    /// The first event of every file: `"brain.Event:2"`.
    FileVersion(String),
    Summary(Vec<ScalarValue>),
    Text(TextValue),
}

#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    pub wall_time: f64,
    pub step: i64,
    pub kind: EventKind,
}

impl Event {
    /// The protobuf wire encoding.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        put_key(&mut out, 1, WIRE_FIXED64);
        out.extend_from_slice(&self.wall_time.to_le_bytes());
        put_key(&mut out, 2, WIRE_VARINT);
        // int64 is encoded as the two's-complement u64 varint.
        put_varint(&mut out, self.step as u64);
        match &self.kind {
            EventKind::FileVersion(v) => put_bytes(&mut out, 3, v.as_bytes()),
            EventKind::Summary(values) => {
                let mut summary = Vec::new();
                for v in values {
                    let mut value = Vec::new();
                    put_bytes(&mut value, 1, v.tag.as_bytes());
                    put_key(&mut value, 2, WIRE_FIXED32);
                    value.extend_from_slice(&v.simple_value.to_le_bytes());
                    put_bytes(&mut summary, 1, &value);
                }
                put_bytes(&mut out, 5, &summary);
            }
            EventKind::Text(t) => {
                let mut value = Vec::new();
                put_bytes(&mut value, 1, t.tag.as_bytes());
                put_bytes(&mut value, 8, &text_tensor(&t.text));
                put_bytes(&mut value, 9, &text_metadata());
                let mut summary = Vec::new();
                put_bytes(&mut summary, 1, &value);
                put_bytes(&mut out, 5, &summary);
            }
        }
        out
    }

    /// Decodes an event holding a file version or scalar summary values; unknown fields are
    /// skipped as protobuf requires.
    pub fn decode(bytes: &[u8]) -> Result<Event> {
        let mut event = Event { wall_time: 0.0, step: 0, kind: EventKind::Summary(Vec::new()) };
        let mut r = Reader { bytes, pos: 0 };
        while let Some((field, wire)) = r.key()? {
            match (field, wire) {
                (1, WIRE_FIXED64) => event.wall_time = f64::from_le_bytes(r.fixed::<8>()?),
                (2, WIRE_VARINT) => event.step = r.varint()? as i64,
                (3, WIRE_LEN) => event.kind = EventKind::FileVersion(String::from_utf8(r.len_delimited()?.to_vec())?),
                (5, WIRE_LEN) => {
                    let summary = r.len_delimited()?;
                    event.kind = match decode_text(summary)? {
                        Some(t) => EventKind::Text(t),
                        None => EventKind::Summary(decode_summary(summary)?),
                    }
                }
                _ => r.skip(wire)?,
            }
        }
        Ok(event)
    }
}

/// `TensorProto { dtype = DT_STRING (7); tensor_shape { dim { size: 1 } }; string_val: [text] }`
/// (fields 1, 2 and 8; `TensorShapeProto.dim` = 2, `Dim.size` = 1).
fn text_tensor(text: &str) -> Vec<u8> {
    let mut dim = Vec::new();
    put_key(&mut dim, 1, WIRE_VARINT);
    put_varint(&mut dim, 1);
    let mut shape = Vec::new();
    put_bytes(&mut shape, 2, &dim);
    let mut tensor = Vec::new();
    put_key(&mut tensor, 1, WIRE_VARINT);
    put_varint(&mut tensor, 7);
    put_bytes(&mut tensor, 2, &shape);
    put_bytes(&mut tensor, 8, text.as_bytes());
    tensor
}

/// `SummaryMetadata { plugin_data { plugin_name: "text", content: TextPluginData{version: 0} } }`
/// (the content serialises to zero bytes, and proto3 omits an empty `bytes` field).
fn text_metadata() -> Vec<u8> {
    let mut plugin = Vec::new();
    put_bytes(&mut plugin, 1, b"text");
    let mut meta = Vec::new();
    put_bytes(&mut meta, 1, &plugin);
    meta
}

/// The text of a `TextValue`-shaped summary, if `summary` is one.
fn decode_text(summary: &[u8]) -> Result<Option<TextValue>> {
    let mut r = Reader { bytes: summary, pos: 0 };
    while let Some((field, wire)) = r.key()? {
        if (field, wire) != (1, WIRE_LEN) {
            r.skip(wire)?;
            continue;
        }
        let (mut tag, mut text) = (String::new(), None);
        let mut vr = Reader { bytes: r.len_delimited()?, pos: 0 };
        while let Some((f, w)) = vr.key()? {
            match (f, w) {
                (1, WIRE_LEN) => tag = String::from_utf8(vr.len_delimited()?.to_vec())?,
                (8, WIRE_LEN) => {
                    let mut tr = Reader { bytes: vr.len_delimited()?, pos: 0 };
                    while let Some((tf, tw)) = tr.key()? {
                        match (tf, tw) {
                            (8, WIRE_LEN) => text = Some(String::from_utf8(tr.len_delimited()?.to_vec())?),
                            _ => tr.skip(tw)?,
                        }
                    }
                }
                _ => vr.skip(w)?,
            }
        }
        if let Some(text) = text {
            return Ok(Some(TextValue { tag, text }));
        }
    }
    Ok(None)
}

fn decode_summary(bytes: &[u8]) -> Result<Vec<ScalarValue>> {
    let mut values = Vec::new();
    let mut r = Reader { bytes, pos: 0 };
    while let Some((field, wire)) = r.key()? {
        if (field, wire) != (1, WIRE_LEN) {
            r.skip(wire)?;
            continue;
        }
        let mut v = ScalarValue { tag: String::new(), simple_value: 0.0 };
        let mut vr = Reader { bytes: r.len_delimited()?, pos: 0 };
        while let Some((f, w)) = vr.key()? {
            match (f, w) {
                (1, WIRE_LEN) => v.tag = String::from_utf8(vr.len_delimited()?.to_vec())?,
                (2, WIRE_FIXED32) => v.simple_value = f32::from_le_bytes(vr.fixed::<4>()?),
                _ => vr.skip(w)?,
            }
        }
        values.push(v);
    }
    Ok(values)
}

fn put_key(out: &mut Vec<u8>, field: u32, wire: u8) {
    put_varint(out, ((field as u64) << 3) | wire as u64);
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_bytes(out: &mut Vec<u8>, field: u32, bytes: &[u8]) {
    put_key(out, field, WIRE_LEN);
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn key(&mut self) -> Result<Option<(u64, u8)>> {
        if self.pos == self.bytes.len() {
            return Ok(None);
        }
        let k = self.varint()?;
        Ok(Some((k >> 3, (k & 7) as u8)))
    }

    fn varint(&mut self) -> Result<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = *self.bytes.get(self.pos).ok_or_else(|| anyhow::anyhow!("protobuf: truncated varint"))?;
            self.pos += 1;
            v |= ((b & 0x7F) as u64) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        bail!("protobuf: varint longer than 10 bytes at byte {}", self.pos)
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.bytes.len());
        let Some(end) = end else { bail!("protobuf: field of {n} bytes at byte {} is truncated", self.pos) };
        let s = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn fixed<const N: usize>(&mut self) -> Result<[u8; N]> {
        Ok(self.take(N)?.try_into()?)
    }

    fn len_delimited(&mut self) -> Result<&'a [u8]> {
        let n = usize::try_from(self.varint()?)?;
        self.take(n)
    }

    fn skip(&mut self, wire: u8) -> Result<()> {
        match wire {
            WIRE_VARINT => self.varint().map(|_| ()),
            WIRE_FIXED64 => self.take(8).map(|_| ()),
            WIRE_LEN => self.len_delimited().map(|_| ()),
            WIRE_FIXED32 => self.take(4).map(|_| ()),
            other => bail!("protobuf: unsupported wire type {other} at byte {}", self.pos),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varint_encoding_matches_protobuf_examples() {
        // Examples from the protobuf encoding guide.
        let mut out = Vec::new();
        put_varint(&mut out, 150);
        assert_eq!(out, [0x96, 0x01]);
        out.clear();
        put_varint(&mut out, 1);
        assert_eq!(out, [0x01]);
        out.clear();
        put_varint(&mut out, -1i64 as u64);
        assert_eq!(out.len(), 10);
    }

    #[test]
    fn known_encoding_of_a_file_version_event() {
        let e = Event { wall_time: 1.5, step: 0, kind: EventKind::FileVersion("brain.Event:2".into()) };
        let bytes = e.encode();
        // key(1, fixed64) = 0x09, 8 bytes of 1.5, key(2, varint) = 0x10, 0, key(3, len) = 0x1a.
        let mut expected = vec![0x09];
        expected.extend_from_slice(&1.5f64.to_le_bytes());
        expected.extend_from_slice(&[0x10, 0x00, 0x1a, 13]);
        expected.extend_from_slice(b"brain.Event:2");
        assert_eq!(bytes, expected);
        assert_eq!(Event::decode(&bytes).unwrap(), e);
    }

    #[test]
    fn summary_round_trip_with_negative_step_and_unknown_field() {
        let e = Event {
            wall_time: 1234.25,
            step: -3,
            kind: EventKind::Summary(vec![
                ScalarValue { tag: "lm loss".into(), simple_value: 2.5 },
                ScalarValue { tag: "lm loss vs samples".into(), simple_value: -0.125 },
            ]),
        };
        let mut bytes = e.encode();
        // An unknown varint field 9 must be skipped.
        bytes.extend_from_slice(&[0x48, 0x07]);
        assert_eq!(Event::decode(&bytes).unwrap(), e);
        assert!(Event::decode(&bytes[..bytes.len() - 5]).is_err());
    }

    #[test]
    fn text_summary_has_torchs_layout_and_round_trips() {
        let e = Event {
            wall_time: 2.0,
            step: 5,
            kind: EventKind::Text(TextValue { tag: "lr/text_summary".into(), text: "0.1".into() }),
        };
        let bytes = e.encode();
        // Summary { value { tag, tensor { dtype: 7, shape { dim { size: 1 } }, string_val },
        // metadata { plugin_data { plugin_name: "text" } } } } in field order 1, 8, 9.
        let mut value = vec![0x0a, 15];
        value.extend_from_slice(b"lr/text_summary");
        value.extend_from_slice(&[0x42, 13, 0x08, 7, 0x12, 4, 0x12, 2, 0x08, 1, 0x42, 3]);
        value.extend_from_slice(b"0.1");
        value.extend_from_slice(&[0x4a, 8, 0x0a, 6, 0x0a, 4]);
        value.extend_from_slice(b"text");
        let mut summary = vec![0x0a, value.len() as u8];
        summary.extend_from_slice(&value);
        let mut want = vec![0x09];
        want.extend_from_slice(&2.0f64.to_le_bytes());
        want.extend_from_slice(&[0x10, 5, 0x2a, summary.len() as u8]);
        want.extend_from_slice(&summary);
        assert_eq!(bytes, want);
        assert_eq!(Event::decode(&bytes).unwrap(), e);
    }
}

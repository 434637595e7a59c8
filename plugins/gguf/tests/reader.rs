//! The GGUF container reader on small hand-written files: metadata of every type, tensor
//! infos and aligned data; truncated and malformed files are errors, never panics or huge
//! allocations (every prefix of a valid file and corrupted counts are tried).

use megatron_gguf::{GgmlType, GgufFile, GgufValue};

fn s(out: &mut Vec<u8>, v: &str) {
    out.extend((v.len() as u64).to_le_bytes());
    out.extend(v.as_bytes());
}

/// A GGUF v3 file: a few metadata values, an F32 `[2, 3]` and a Q8_0 `[1, 32]` tensor.
fn sample() -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend(3u32.to_le_bytes());
    b.extend(2u64.to_le_bytes()); // tensors
    b.extend(4u64.to_le_bytes()); // metadata
    s(&mut b, "general.architecture");
    b.extend(8u32.to_le_bytes());
    s(&mut b, "llama");
    s(&mut b, "llama.block_count");
    b.extend(4u32.to_le_bytes());
    b.extend(30u32.to_le_bytes());
    s(&mut b, "llama.rope.freq_base");
    b.extend(6u32.to_le_bytes());
    b.extend(100000f32.to_le_bytes());
    s(&mut b, "tokenizer.ggml.tokens");
    b.extend(9u32.to_le_bytes());
    b.extend(8u32.to_le_bytes());
    b.extend(2u64.to_le_bytes());
    s(&mut b, "a");
    s(&mut b, "bc");
    // tensor infos
    s(&mut b, "w");
    b.extend(2u32.to_le_bytes());
    b.extend(3u64.to_le_bytes());
    b.extend(2u64.to_le_bytes());
    b.extend(0u32.to_le_bytes());
    b.extend(0u64.to_le_bytes());
    s(&mut b, "q");
    b.extend(2u32.to_le_bytes());
    b.extend(32u64.to_le_bytes());
    b.extend(1u64.to_le_bytes());
    b.extend(8u32.to_le_bytes());
    b.extend(32u64.to_le_bytes());
    while !b.len().is_multiple_of(32) {
        b.push(0);
    }
    for i in 0..6 {
        b.extend((i as f32 * 0.5).to_le_bytes());
    }
    b.extend([0u8; 8]); // pad to offset 32
    b.extend(half::f16::from_f32(0.25).to_le_bytes());
    b.extend((0..32).map(|i| (i as i8 - 16) as u8));
    b
}

#[test]
fn reads_metadata_tensor_infos_and_data() {
    let f = GgufFile::parse(sample(), "sample.gguf").unwrap();
    assert_eq!(f.version, 3);
    assert_eq!(f.str("general.architecture").unwrap(), "llama");
    assert_eq!(f.u64("llama.block_count").unwrap(), 30);
    assert_eq!(f.f64("llama.rope.freq_base").unwrap(), 100000.0);
    assert_eq!(f.strings("tokenizer.ggml.tokens").unwrap(), vec!["a", "bc"]);
    assert_eq!(f.get("llama.block_count"), Some(&GgufValue::U32(30)));
    let (w, shape) = f.read_f32("w").unwrap();
    assert_eq!(shape, vec![2, 3]);
    assert_eq!(w, vec![0.0, 0.5, 1.0, 1.5, 2.0, 2.5]);
    let (q, shape) = f.read_f32("q").unwrap();
    assert_eq!(shape, vec![1, 32]);
    assert_eq!(f.tensor("q").unwrap().ggml_type, GgmlType::Q8_0);
    assert_eq!(q[0], -4.0);
    assert_eq!(q[31], 3.75);
    let e = f.u64("missing.key").unwrap_err().to_string();
    assert!(e.contains("sample.gguf") && e.contains("missing.key"), "{e}");
}

#[test]
fn every_truncation_is_a_clear_error() {
    let full = sample();
    for n in 0..full.len() {
        let e = match GgufFile::parse(full[..n].to_vec(), "cut.gguf") {
            Ok(_) => panic!("a file cut at {n} of {} bytes parsed", full.len()),
            Err(e) => format!("{e:#}"),
        };
        assert!(e.contains("cut.gguf"), "{e}");
    }
}

#[test]
fn corrupt_fields_are_errors_not_allocations() {
    let good = sample();
    let patch = |at: usize, bytes: &[u8]| {
        let mut b = good.clone();
        b[at..at + bytes.len()].copy_from_slice(bytes);
        GgufFile::parse(b, "bad.gguf").err().map(|e| format!("{e:#}")).expect("must fail")
    };
    assert!(patch(0, b"GGUG").contains("magic"));
    assert!(patch(4, &1u32.to_le_bytes()).contains("version 1"));
    // Tensor count and metadata count of 2^60: rejected before allocating.
    assert!(patch(8, &(1u64 << 60).to_le_bytes()).contains("cannot fit"));
    assert!(patch(16, &(1u64 << 60).to_le_bytes()).contains("cannot fit"));
    // The first key's length.
    assert!(patch(24, &u64::MAX.to_le_bytes()).contains("cannot fit"));
    // Flip every byte in turn: never a panic.
    for i in 0..good.len() {
        let mut b = good.clone();
        b[i] ^= 0xA5;
        let _ = GgufFile::parse(b, "flip.gguf");
    }
}

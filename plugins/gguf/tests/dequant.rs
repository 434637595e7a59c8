//! Every supported ggml type against gguf-py's dequantization of the same random blocks
//! (fixture from `scripts/gguf_dequant_fixture.py`), bit for bit.

use megatron_gguf::{dequantize, GgmlType};

fn hex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

#[test]
fn dequantization_is_bit_exact_against_gguf_py() {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/dequant_fixture.json")).unwrap();
    let fixture: serde_json::Value = serde_json::from_str(&text).unwrap();
    let cases = fixture["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 8, "one case per supported type");
    for case in cases {
        let ty = GgmlType::from_id(case["type"].as_u64().unwrap() as u32).unwrap();
        let raw = hex(case["raw_hex"].as_str().unwrap());
        let want: Vec<u32> =
            case["values_bits"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
        let got = dequantize(ty, &raw, want.len()).unwrap();
        let got: Vec<u32> = got.iter().map(|v| v.to_bits()).collect();
        let bad = got.iter().zip(&want).position(|(a, b)| a != b);
        assert!(
            bad.is_none(),
            "{ty:?}: value {bad:?} differs: {:?} vs {:?}",
            got.get(bad.unwrap()),
            want.get(bad.unwrap())
        );
        // One byte short is an error, not a panic.
        assert!(dequantize(ty, &raw[..raw.len() - 1], want.len()).is_err());
    }
}

#[test]
fn unsupported_types_name_the_supported_ones() {
    let e = GgmlType::from_id(13).unwrap_err().to_string();
    assert!(e.contains("Q4_K") && e.contains("not supported"), "{e}");
    assert!(GgmlType::from_id(1000).is_err());
    assert!(GgmlType::Q4K.byte_size(256 * 3, 100).is_err(), "rows must be whole blocks");
}

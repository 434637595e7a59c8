//! The relative-position buckets against transformers' `T5Attention._relative_position_bucket`
//! (fixture made by `scripts/t5_relative_buckets.py`: five (bidirectional, buckets, max
//! distance) settings over relative positions -300..=300).

use megatron_t5::relative::relative_position_bucket;

#[test]
fn matches_transformers_fixture() {
    let text = include_str!("fixtures/relative_buckets.json");
    let v: serde_json::Value = serde_json::from_str(text).expect("fixture json");
    let from = v["relative_from"].as_i64().expect("relative_from");
    let cases = v["cases"].as_array().expect("cases");
    assert_eq!(cases.len(), 5);
    for c in cases {
        let bi = c["bidirectional"].as_bool().expect("bidirectional");
        let nb = c["num_buckets"].as_u64().expect("num_buckets") as usize;
        let md = c["max_distance"].as_u64().expect("max_distance") as usize;
        let want: Vec<usize> =
            c["buckets"].as_array().expect("buckets").iter().map(|b| b.as_u64().unwrap() as usize).collect();
        assert_eq!(want.len(), 601);
        for (k, &w) in want.iter().enumerate() {
            let rel = from + k as i64;
            assert_eq!(
                relative_position_bucket(rel, bi, nb, md),
                w,
                "relative {rel} bidirectional={bi} buckets={nb} max={md}"
            );
        }
    }
}

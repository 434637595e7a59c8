//! The RACE reader (SPEC §9.3) on the fixture of `scripts/race_fixture.py`
//! (`fixtures/race/{train,dev}`: synthetic documents in the RACE distribution's layout; the
//! script also wrote `*_expected.jsonl`, what Megatron's `tasks/race/data.py` rules make of
//! every question, computed in Python): the reader gives exactly those questions in order,
//! and bad documents are refused with the file, line and field.

use megatron_datasets::bert::race::{read_race_dir, RaceQuestion, NUM_CHOICES};
use std::path::PathBuf;

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/race")
}

fn expected(split: &str) -> Vec<RaceQuestion> {
    let text = std::fs::read_to_string(fixture().join(format!("{split}_expected.jsonl"))).unwrap();
    text.lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            let qa: Vec<String> = v["qa"].as_array().unwrap().iter().map(|s| s.as_str().unwrap().to_string()).collect();
            RaceQuestion {
                context: v["context"].as_str().unwrap().to_string(),
                qa: qa.try_into().unwrap(),
                label: v["label"].as_u64().unwrap() as usize,
            }
        })
        .collect()
}

#[test]
fn reader_gives_megatrons_questions_exactly() {
    for (split, n) in [("train", 24), ("dev", 12)] {
        let got = read_race_dir(&fixture().join(split)).unwrap();
        let want = expected(split);
        assert_eq!(want.len(), n, "{split}_expected.jsonl");
        assert_eq!(got.len(), want.len(), "{split}");
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g, w, "{split} question {i}");
        }
        // Every answer letter occurs; blanks were filled (no `_` left) and spaces cleaned.
        assert!((0..NUM_CHOICES).all(|l| got.iter().any(|q| q.label == l)) || split == "dev");
        assert!(got.iter().all(|q| q.qa.iter().all(|s| !s.contains('_') && !s.contains("  "))));
        assert!(got.iter().all(|q| !q.context.contains('\n') && !q.context.contains(" . ")));
    }
}

#[test]
fn hand_written_document_and_errors() {
    let dir = tempfile::tempdir().unwrap();
    // Two files, read in name order whatever the directory order; a non-.txt file ignored.
    let doc = r#"{"article": "A  cat\nsat . Then it  left .", "questions": ["Who _ ?", "Why"], "options": [["Ann", "Bo", "Cy", "Di"], ["a", "b", "c", "d"]], "answers": ["C", "A"]}"#;
    std::fs::write(dir.path().join("b.txt"), format!("{doc}\n")).unwrap();
    let first = r#"{"article": "x", "questions": ["q"], "options": [["1", "2", "3", "4"]], "answers": ["D"]}"#;
    std::fs::write(dir.path().join("a.txt"), format!("{first}\n\n")).unwrap();
    std::fs::write(dir.path().join("notes.md"), "not RACE").unwrap();
    let q = read_race_dir(dir.path()).unwrap();
    assert_eq!(q.len(), 3);
    assert_eq!(
        q[0],
        RaceQuestion { context: "x".into(), qa: ["q 1", "q 2", "q 3", "q 4"].map(String::from), label: 3 }
    );
    assert_eq!(q[1].context, "A cat sat. Then it left .");
    assert_eq!(q[1].qa, ["Who Ann ?", "Who Bo ?", "Who Cy ?", "Who Di ?"].map(String::from));
    assert_eq!((q[1].label, q[2].label), (2, 0));
    assert_eq!(q[2].qa[3], "Why d");

    let bad = |line: &str| {
        std::fs::write(dir.path().join("b.txt"), line).unwrap();
        format!("{:#}", read_race_dir(dir.path()).unwrap_err())
    };
    let e = bad(&doc.replace(r#""answers": ["C", "A"]"#, r#""answers": ["E", "A"]"#));
    assert!(e.contains("b.txt line 1") && e.contains("answer `E`"), "{e}");
    let e = bad(&doc.replace(r#"["a", "b", "c", "d"]"#, r#"["a", "b", "c"]"#));
    assert!(e.contains("3 options"), "{e}");
    let e = bad(&doc.replace(r#", "A"]"#, "]"));
    assert!(e.contains("2 questions") && e.contains("1 answers"), "{e}");
    let e = bad("{not json");
    assert!(e.contains("b.txt line 1") && e.contains("article, questions, options, answers"), "{e}");
    let empty = tempfile::tempdir().unwrap();
    let e = format!("{:#}", read_race_dir(empty.path()).unwrap_err());
    assert!(e.contains("no *.txt files"), "{e}");
    let e = format!("{:#}", read_race_dir(&empty.path().join("missing")).unwrap_err());
    assert!(e.contains("RACE directory"), "{e}");
}

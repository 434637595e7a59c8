//! GLUE classification data for BERT finetuning (SPEC §9.4, Megatron's `tasks/glue`): the TSV
//! readers of MNLI and QQP as Megatron reads them, plus MRPC and RTE in the GLUE distribution's
//! TSV layout, the text cleaning of `tasks/data_utils.clean_text`, and the sample layout of
//! `build_tokens_types_paddings_from_ids` (`[CLS] a [SEP] b [SEP]`, types 0/1, padding).

use anyhow::{bail, Context, Result};
use std::path::Path;

/// A GLUE task this reader knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GlueTask {
    /// `text_a` = column 8, `text_b` = column 9, label (last column) in
    /// `{contradiction: 0, entailment: 1, neutral: 2}`; a header row.
    Mnli,
    /// `id qid1 qid2 question1 question2 is_duplicate`: columns 3, 4, label 5; a header row.
    Qqp,
    /// `Quality #1 ID #2 ID #1 String #2 String`: label column 0, texts 3 and 4; a header row.
    Mrpc,
    /// `index sentence1 sentence2 label` with `{entailment: 0, not_entailment: 1}`; a header row.
    Rte,
}

impl GlueTask {
    pub fn parse(name: &str) -> Result<GlueTask> {
        Ok(match name.to_ascii_uppercase().as_str() {
            "MNLI" => GlueTask::Mnli,
            "QQP" => GlueTask::Qqp,
            "MRPC" => GlueTask::Mrpc,
            "RTE" => GlueTask::Rte,
            _ => bail!("--task {name}: the GLUE tasks are MNLI, QQP, MRPC and RTE"),
        })
    }

    pub fn num_classes(self) -> usize {
        if self == GlueTask::Mnli {
            3
        } else {
            2
        }
    }
}

/// One labelled pair.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GlueExample {
    pub text_a: String,
    pub text_b: String,
    pub label: usize,
}

/// Megatron's `clean_text`: newlines to spaces, runs of whitespace to one space, `" . "` to `". "`.
pub fn clean_text(text: &str) -> String {
    let mut t = text.replace('\n', " ").split_whitespace().collect::<Vec<_>>().join(" ");
    if text.starts_with(char::is_whitespace) {
        t.insert(0, ' ');
    }
    if text.ends_with(char::is_whitespace) && !t.is_empty() {
        t.push(' ');
    }
    for _ in 0..3 {
        t = t.replace(" . ", ". ");
    }
    t
}

/// Reads a task's TSV file (header row skipped); every row must have the task's columns.
pub fn read_glue_tsv(path: &Path, task: GlueTask) -> Result<Vec<GlueExample>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate().skip(1) {
        if line.trim().is_empty() {
            continue;
        }
        let row: Vec<&str> = line.split('\t').collect();
        let at = |c: usize| -> Result<&str> {
            row.get(c).copied().with_context(|| {
                format!(
                    "{} line {}: {} columns, the {task:?} layout needs column {c}",
                    path.display(),
                    i + 1,
                    row.len()
                )
            })
        };
        let bad_label = |l: &str| format!("{} line {}: unknown {task:?} label `{l}`", path.display(), i + 1);
        let (a, b, label) = match task {
            GlueTask::Mnli => {
                let l = *row.last().unwrap_or(&"");
                let label = match l.trim() {
                    "contradiction" => 0,
                    "entailment" => 1,
                    "neutral" => 2,
                    other => bail!(bad_label(other)),
                };
                (at(8)?, at(9)?, label)
            }
            GlueTask::Qqp | GlueTask::Mrpc => {
                let (a, b, l) = if task == GlueTask::Qqp { (3, 4, 5) } else { (3, 4, 0) };
                let label = match at(l)?.trim() {
                    "0" => 0,
                    "1" => 1,
                    other => bail!(bad_label(other)),
                };
                (at(a)?, at(b)?, label)
            }
            GlueTask::Rte => {
                let label = match at(3)?.trim() {
                    "entailment" => 0,
                    "not_entailment" => 1,
                    other => bail!(bad_label(other)),
                };
                (at(1)?, at(2)?, label)
            }
        };
        out.push(GlueExample { text_a: clean_text(a), text_b: clean_text(b), label });
    }
    if out.is_empty() {
        bail!("{}: no {task:?} examples (a header row and then one example per line)", path.display());
    }
    Ok(out)
}

/// Megatron's `build_tokens_types_paddings_from_ids`: `[CLS] a [SEP] b [SEP]`, types 0 then
/// 1; over-long input is cut to `max_len − 1` and `[SEP]` appended again; padding with
/// `pad` (types too) to `max_len`. Returns `(ids, types, real length)`.
pub fn build_pair_sample(
    a: &[i64],
    b: Option<&[i64]>,
    max_len: usize,
    cls: i64,
    sep: i64,
    pad: i64,
) -> (Vec<i64>, Vec<i64>, usize) {
    let mut ids = vec![cls];
    ids.extend_from_slice(a);
    ids.push(sep);
    let mut types = vec![0i64; ids.len()];
    if let Some(b) = b {
        ids.extend_from_slice(b);
        types.resize(ids.len(), 1);
    }
    let trimmed = ids.len() >= max_len;
    if trimmed {
        ids.truncate(max_len - 1);
        types.truncate(max_len - 1);
    }
    if b.is_some() || trimmed {
        ids.push(sep);
        types.push(i64::from(b.is_some()));
    }
    let len = ids.len();
    ids.resize(max_len, pad);
    types.resize(max_len, pad);
    (ids, types, len)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pair_layout_and_truncation() {
        let (ids, types, len) = build_pair_sample(&[7, 8], Some(&[9]), 8, 101, 102, 0);
        assert_eq!(ids, [101, 7, 8, 102, 9, 102, 0, 0]);
        assert_eq!(types, [0, 0, 0, 0, 1, 1, 0, 0]);
        assert_eq!(len, 6);
        // Too long: cut to max_len - 1, [SEP] again.
        let (ids, types, len) = build_pair_sample(&[1, 2, 3, 4], Some(&[5, 6, 7]), 6, 101, 102, 0);
        assert_eq!(ids, [101, 1, 2, 3, 4, 102]);
        assert_eq!(types, [0, 0, 0, 0, 0, 1]);
        assert_eq!(len, 6);
    }

    #[test]
    fn readers_and_cleaning() {
        assert_eq!(clean_text("a  b\nc . d"), "a b c. d");
        let dir = std::env::temp_dir().join(format!("glue_{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let rte = dir.join("rte.tsv");
        std::fs::write(&rte, "index\tsentence1\tsentence2\tlabel\n0\tA b.\tC\tnot_entailment\n1\tX\tY\tentailment\n")
            .unwrap();
        let ex = read_glue_tsv(&rte, GlueTask::Rte).unwrap();
        assert_eq!(ex[0], GlueExample { text_a: "A b.".into(), text_b: "C".into(), label: 1 });
        assert_eq!(ex[1].label, 0);
        let mrpc = dir.join("mrpc.tsv");
        std::fs::write(&mrpc, "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n1\t1\t2\tHe went.\tHe left.\n").unwrap();
        assert_eq!(read_glue_tsv(&mrpc, GlueTask::Mrpc).unwrap()[0].label, 1);
        std::fs::write(&mrpc, "h\n1\t2\n").unwrap();
        let e = read_glue_tsv(&mrpc, GlueTask::Mrpc).unwrap_err().to_string();
        assert!(e.contains("line 2") && e.contains("column 3"), "{e}");
        std::fs::remove_dir_all(&dir).ok();
    }
}

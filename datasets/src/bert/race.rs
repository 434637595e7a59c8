//! RACE multiple-choice data for BERT finetuning (SPEC §9.3, Megatron's `tasks/race/data.py`):
//! a `--train-data` / `--valid-data` path is a directory (e.g. `RACE/train/middle`) whose
//! `*.txt` files hold one JSON document per line, `{"article": …, "questions": [...],
//! "options": [[4 strings], ...], "answers": ["A".."D", ...]}` (the RACE distribution has one
//! document per file). Every question becomes [`NUM_CHOICES`] texts `qa`: the question with
//! `_` replaced by the option when it has a blank, else `question + " " + option`, cleaned
//! like the article (`clean_text`). [`build_choice_sample`] lays one choice out as Megatron
//! does: `[CLS] qa [SEP] article [SEP]` (qa cut to [`MAX_QA_LENGTH`] tokens first, types 0
//! then 1, the article truncated at the end). SPEC §9.3 writes the pair the other way round;
//! Megatron's code passes `qa_ids` as text A and the article as text B, which is followed
//! here.
//!
//! Megatron lists the files with `glob` (directory order); they are read here in sorted file
//! name order so the data order does not depend on the file system.

use super::glue::{build_pair_sample, clean_text};
use anyhow::{bail, Context, Result};
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// Options per question (Megatron's `NUM_CHOICES`).
pub const NUM_CHOICES: usize = 4;
/// Tokens of `qa` kept before the article (Megatron's `MAX_QA_LENGTH`).
pub const MAX_QA_LENGTH: usize = 128;

/// One question: the cleaned article and the cleaned `qa` text of every option.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RaceQuestion {
    pub context: String,
    pub qa: [String; NUM_CHOICES],
    /// `ord(answer) − ord('A')`.
    pub label: usize,
}

#[derive(Deserialize)]
struct RaceDoc {
    article: String,
    questions: Vec<String>,
    options: Vec<Vec<String>>,
    answers: Vec<String>,
}

/// The `*.txt` files of a RACE directory, sorted by name.
pub fn race_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let entries = std::fs::read_dir(dir).with_context(|| {
        format!(
            "reading the RACE directory {} (give a directory of *.txt files, e.g. RACE/train/middle)",
            dir.display()
        )
    })?;
    let mut files = Vec::new();
    for e in entries {
        let p = e.with_context(|| format!("listing {}", dir.display()))?.path();
        if p.is_file() && p.extension().is_some_and(|x| x == "txt") {
            files.push(p);
        }
    }
    files.sort();
    if files.is_empty() {
        bail!("{}: no *.txt files (a RACE directory holds one JSON document per line in *.txt files)", dir.display());
    }
    Ok(files)
}

/// The `qa` text of `option` for `question` (before cleaning): Megatron fills a blank.
pub fn join_question(question: &str, option: &str) -> String {
    if question.contains('_') {
        question.replace('_', option)
    } else {
        format!("{question} {option}")
    }
}

/// Every question of every document in the directory's `*.txt` files, in file order.
pub fn read_race_dir(dir: &Path) -> Result<Vec<RaceQuestion>> {
    let mut out = Vec::new();
    for file in race_files(dir)? {
        let text = std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let at = || format!("{} line {}", file.display(), i + 1);
            let doc: RaceDoc = serde_json::from_str(line).with_context(|| {
                format!("{}: not a RACE document (a JSON object with article, questions, options, answers)", at())
            })?;
            if doc.questions.len() != doc.answers.len() || doc.questions.len() != doc.options.len() {
                bail!(
                    "{}: {} questions, {} options lists and {} answers (one of each per question)",
                    at(),
                    doc.questions.len(),
                    doc.options.len(),
                    doc.answers.len()
                );
            }
            let context = clean_text(&doc.article);
            for (q, ((question, options), answer)) in
                doc.questions.iter().zip(&doc.options).zip(&doc.answers).enumerate()
            {
                let label = match answer.as_bytes() {
                    [c @ b'A'..=b'Z'] if ((c - b'A') as usize) < NUM_CHOICES => (c - b'A') as usize,
                    _ => bail!("{} question {q}: answer `{answer}` is not one of A, B, C, D", at()),
                };
                if options.len() != NUM_CHOICES {
                    bail!("{} question {q}: {} options, RACE has {NUM_CHOICES}", at(), options.len());
                }
                let qa = std::array::from_fn(|c| clean_text(&join_question(question, &options[c])));
                out.push(RaceQuestion { context: context.clone(), qa, label });
            }
        }
    }
    if out.is_empty() {
        bail!("{}: no RACE questions in its *.txt files", dir.display());
    }
    Ok(out)
}

/// One choice's sample (Megatron's `build_tokens_types_paddings_from_ids(qa_ids, context_ids,
/// ...)` after cutting `qa` to [`MAX_QA_LENGTH`]): `(ids, types, real length)`.
pub fn build_choice_sample(
    qa: &[i64],
    context: &[i64],
    max_len: usize,
    cls: i64,
    sep: i64,
    pad: i64,
) -> (Vec<i64>, Vec<i64>, usize) {
    let qa = &qa[..qa.len().min(MAX_QA_LENGTH)];
    build_pair_sample(qa, Some(context), max_len, cls, sep, pad)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blanks_are_filled_and_questions_joined() {
        assert_eq!(join_question("The _ sat on the _ .", "cat"), "The cat sat on the cat .");
        assert_eq!(join_question("Who wrote it?", "Ann"), "Who wrote it? Ann");
    }

    #[test]
    fn qa_comes_first_and_is_capped() {
        let qa: Vec<i64> = (1000..1200).collect();
        let (ids, types, len) = build_choice_sample(&qa, &[7, 8], 300, 101, 102, 0);
        // 128 qa tokens kept: [CLS] qa(128) [SEP] 7 8 [SEP].
        assert_eq!(len, 1 + 128 + 1 + 2 + 1);
        assert_eq!(&ids[..2], &[101, 1000]);
        assert_eq!(&ids[128..133], &[1127, 102, 7, 8, 102]);
        assert_eq!(&types[129..133], &[0, 1, 1, 1]);
        // A long article is cut at the end, [SEP] again.
        let (ids, _, len) = build_choice_sample(&[5], &[9; 20], 8, 101, 102, 0);
        assert_eq!((ids, len), (vec![101, 5, 102, 9, 9, 9, 9, 102], 8));
    }
}

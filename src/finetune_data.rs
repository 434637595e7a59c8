//! The examples of `megatron finetune`: a task name (`--task`), its reader and the BERT samples
//! of every example. A GLUE example is one `[CLS] a [SEP] b [SEP]` row
//! (`megatron_datasets::bert::glue`); a RACE question is [`NUM_CHOICES`] rows `[CLS] qa [SEP]
//! article [SEP]`, one per option (`megatron_datasets::bert::race`, a directory of `*.txt`
//! files per `--train-data` / `--valid-data` path).

use anyhow::{bail, Result};
use megatron_core::Tokenizer;
use megatron_datasets::bert::glue::{build_pair_sample, read_glue_tsv, GlueTask};
use megatron_datasets::bert::race::{build_choice_sample, read_race_dir, NUM_CHOICES};
use std::path::Path;

/// One encoded row: ids, types, real length, label (of its example).
pub type Row = (Vec<i32>, Vec<i32>, usize, i32);

/// One example: its rows (1 for classification, one per option for multiple choice), all
/// carrying the example's label.
pub type Example = Vec<Row>;

/// A `--task`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinetuneTask {
    Glue(GlueTask),
    /// RACE reading comprehension: multiple choice over [`NUM_CHOICES`] options.
    Race,
}

impl FinetuneTask {
    pub fn parse(name: &str) -> Result<FinetuneTask> {
        if name.eq_ignore_ascii_case("RACE") {
            return Ok(FinetuneTask::Race);
        }
        match GlueTask::parse(name) {
            Ok(t) => Ok(FinetuneTask::Glue(t)),
            Err(_) => bail!("--task {name}: the finetuning tasks are MNLI, QQP, MRPC, RTE (GLUE) and RACE"),
        }
    }

    /// The classes of a GLUE task, the options of a RACE question.
    pub fn num_classes(self) -> usize {
        match self {
            FinetuneTask::Glue(t) => t.num_classes(),
            FinetuneTask::Race => NUM_CHOICES,
        }
    }

    /// Rows per example.
    pub fn choices(self) -> usize {
        match self {
            FinetuneTask::Glue(_) => 1,
            FinetuneTask::Race => NUM_CHOICES,
        }
    }

    /// The name stored in the finetuned checkpoint's arguments.
    pub fn name(self) -> String {
        match self {
            FinetuneTask::Glue(t) => format!("{t:?}"),
            FinetuneTask::Race => "Race".into(),
        }
    }

    /// The examples of one data path (a TSV file, or a RACE directory), encoded at `seq`.
    pub fn read(self, path: &Path, tok: &dyn Tokenizer, seq: usize) -> Result<Vec<Example>> {
        let sp = tok.special_ids();
        let (Some(cls), Some(sep)) = (sp.cls, sp.sep) else {
            bail!("tokenizer {} has no [CLS]/[SEP]: finetuning needs a BERT WordPiece vocabulary", tok.name());
        };
        let (cls, sep, pad) = (cls as i64, sep as i64, sp.pad.unwrap_or(0) as i64);
        let ids = |text: &str| -> Result<Vec<i64>> { Ok(tok.encode(text)?.into_iter().map(i64::from).collect()) };
        let row = |(ids, types, len): (Vec<i64>, Vec<i64>, usize), label: usize| -> Row {
            let i32s = |v: Vec<i64>| v.into_iter().map(|x| x as i32).collect::<Vec<_>>();
            (i32s(ids), i32s(types), len, label as i32)
        };
        match self {
            FinetuneTask::Glue(task) => read_glue_tsv(path, task)?
                .iter()
                .map(|e| {
                    let (a, b) = (ids(&e.text_a)?, ids(&e.text_b)?);
                    Ok(vec![row(build_pair_sample(&a, Some(&b), seq, cls, sep, pad), e.label)])
                })
                .collect(),
            FinetuneTask::Race => read_race_dir(path)?
                .iter()
                .map(|q| {
                    let context = ids(&q.context)?;
                    q.qa.iter()
                        .map(|qa| Ok(row(build_choice_sample(&ids(qa)?, &context, seq, cls, sep, pad), q.label)))
                        .collect()
                })
                .collect(),
        }
    }
}

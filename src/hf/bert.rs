//! Hugging Face BERT interchange: `megatron import hf` of a `BertModel` / `BertForPreTraining` /
//! `BertForMaskedLM` directory (`config.json` with `model_type = "bert"`, `model.safetensors`,
//! `vocab.txt`) into a checkpoint at iteration 0, and `megatron export hf` of a `bert`
//! checkpoint back to such a directory. Name maps and layouts live in `megatron_bert::hf`;
//! this module handles checkpoints, args and files. [`load_bert_checkpoint`] rebuilds the
//! model of any `bert` checkpoint: its structure (token types, binary head, LayerNorm
//! placement) from the stored tensors, its sizes from the stored args.

use super::files::{finish_export, write_synced};
use crate::generate::loader::LoadArgs;
use anyhow::{bail, Context, Result};
use megatron_bert::hf::{export_hf_bert, hf_bert_config, load_hf_bert_padded};
use megatron_bert::{BertConfig, BertModel, LayerNormPlacement};
use megatron_checkpoint::CheckpointMeta;
use megatron_core::{Backend, ParallelContext, Registry, Tokenizer};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Whether an HF `config.json` describes a BERT.
pub fn is_bert(cfg: &Value) -> bool {
    cfg["model_type"].as_str() == Some("bert")
}

/// `megatron import hf` of a BERT directory (`cfg` is its parsed `config.json`).
pub fn import(dir: &Path, cfg: &Value, save: &Path, divisible_by: usize, registry: &Registry) -> Result<PathBuf> {
    let vocab = dir.join("vocab.txt");
    if !vocab.is_file() {
        bail!("{} has no vocab.txt: a BERT import needs its WordPiece vocabulary", dir.display());
    }
    // tokenizer_config.json says whether the vocabulary is cased (BERT's default: lower case).
    let lower = std::fs::read_to_string(dir.join("tokenizer_config.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<Value>(&t).ok())
        .and_then(|t| t["do_lower_case"].as_bool())
        .unwrap_or(true);
    let tokenizer_type = if lower { "BertWordPieceLowerCase" } else { "BertWordPieceCase" };
    let backend: Arc<dyn Backend> = registry.backend("cpu", json!({}))?;
    let imp = load_hf_bert_padded(dir, backend.clone(), divisible_by)
        .with_context(|| format!("importing {}", dir.display()))?;
    let tok_dir = save.join("tokenizer");
    std::fs::create_dir_all(&tok_dir).with_context(|| format!("cannot create {}", tok_dir.display()))?;
    std::fs::copy(&vocab, tok_dir.join("vocab.txt"))
        .with_context(|| format!("copying {} into {}", vocab.display(), tok_dir.display()))?;
    let vocab_file = std::fs::canonicalize(&tok_dir)?.join("vocab.txt");
    let tokenizer = registry.tokenizer(tokenizer_type, json!({ "vocab_file": vocab_file }))?;
    let c = imp.model.config().clone();
    // Megatron's BERT tokenizers add [BOS] and [EOS] past vocab.txt: up to 2 more ids is normal.
    if tokenizer.vocab_size() < c.vocab_size || tokenizer.vocab_size() > c.vocab_size + 2 {
        println!(
            "WARNING: config.json vocab_size {} differs from vocab.txt's {}",
            c.vocab_size,
            tokenizer.vocab_size()
        );
    }
    let args = json!({
        "model": "bert",
        "num_layers": c.num_layers,
        "hidden_size": c.hidden_size,
        "ffn_hidden_size": c.ffn(),
        "num_attention_heads": c.num_attention_heads,
        "seq_length": c.max_position_embeddings,
        "max_position_embeddings": c.max_position_embeddings,
        "make_vocab_size_divisible_by": divisible_by,
        "norm_epsilon": c.layernorm_epsilon,
        "init_method_std": cfg["initializer_range"].as_f64().unwrap_or(0.02),
        "bert_binary_head": c.bert_binary_head,
        "bert_post_ln": true,
        "bert_gelu_erf": c.gelu_erf,
        "tensor_model_parallel_size": 1,
        "pipeline_model_parallel_size": 1,
        "tokenizer_type": tokenizer_type,
        "vocab_file": vocab_file,
        "mock_data": false,
        "imported_from": "hf",
        // config.json's vocabulary (Megatron's BERT tokenizers add [BOS]/[EOS] past vocab.txt):
        // what `export hf` writes back.
        "hf_vocab_size": c.vocab_size,
    });
    let meta = CheckpointMeta { args, tokenizer_fingerprint: Some(tokenizer.fingerprint()), ..Default::default() };
    let params = imp.model.params();
    let path = megatron_checkpoint::save(save, 0, &params, None, meta, backend.as_ref(), &ParallelContext::single())
        .with_context(|| format!("saving the imported checkpoint to {}", save.display()))?;
    println!(
        "imported BERT {} ({} layers, hidden {}, vocab {} padded to {}, binary head {}) into {}",
        dir.display(),
        c.num_layers,
        c.hidden_size,
        c.vocab_size,
        imp.model.padded_vocab_size(),
        c.bert_binary_head,
        path.display()
    );
    if !imp.fresh.is_empty() {
        println!("initialised fresh (not in the Hugging Face checkpoint): {}", imp.fresh.join(", "));
    }
    if !imp.unused.is_empty() {
        println!("not used (no counterpart in this model): {}", imp.unused.join(", "));
    }
    Ok(path)
}

/// Whether `flags.load` holds a `bert` checkpoint (its stored args say `model = bert`).
pub fn is_bert_checkpoint(flags: &LoadArgs) -> Result<bool> {
    let ckpt = megatron_checkpoint::load(&flags.load, flags.ckpt_step)
        .with_context(|| format!("opening checkpoint {} (--load)", flags.load.display()))?;
    Ok(ckpt.metadata.meta.args["model"].as_str() == Some("bert"))
}

/// The BERT WordPiece tokenizer of the flags, else of the checkpoint's args.
fn bert_tokenizer(registry: &Registry, flags: &LoadArgs, args: &Value) -> Result<Arc<dyn Tokenizer>> {
    let ty = flags
        .tokenizer_type
        .clone()
        .or_else(|| args["tokenizer_type"].as_str().map(String::from))
        .unwrap_or_else(|| "BertWordPieceLowerCase".to_string());
    let vocab = flags
        .vocab_file
        .clone()
        .or_else(|| args["vocab_file"].as_str().map(PathBuf::from))
        .context("the checkpoint's args name no vocab_file; pass --vocab-file vocab.txt")?;
    registry
        .tokenizer(&ty, json!({ "vocab_file": vocab }))
        .with_context(|| format!("building the checkpoint's tokenizer {ty} over {}", vocab.display()))
}

/// A `bert` checkpoint at tp = 1 with its tokenizer, args and iteration.
pub struct LoadedBert {
    pub model: BertModel,
    pub tokenizer: Arc<dyn Tokenizer>,
    pub args: Value,
    pub iteration: u64,
}

/// Rebuilds the model of a `bert` checkpoint (any TP layout it was saved with) at tp = 1,
/// with `dropout` = `[hidden, attention]` dropout rates (0 for inference and export).
pub fn load_bert_checkpoint(registry: &Registry, flags: &LoadArgs, dropout: [f32; 2]) -> Result<LoadedBert> {
    let dir = &flags.load;
    let ckpt = megatron_checkpoint::load(dir, flags.ckpt_step)
        .with_context(|| format!("opening checkpoint {} (--load)", dir.display()))?;
    let args = ckpt.metadata.meta.args.clone();
    if args["model"].as_str() != Some("bert") {
        bail!("checkpoint {} holds a `{}` model, not `bert`", dir.display(), args["model"]);
    }
    let tokenizer = bert_tokenizer(registry, flags, &args)?;
    let has = |name: &str| ckpt.tensor_names().any(|n| n == name);
    let get = |key: &str| -> Result<usize> {
        args[key].as_u64().map(|v| v as usize).with_context(|| {
            format!("checkpoint {}: metadata args have no integer `{key}`; was it saved by megatron-rs?", dir.display())
        })
    };
    let config = BertConfig {
        num_layers: get("num_layers")?,
        hidden_size: get("hidden_size")?,
        num_attention_heads: get("num_attention_heads")?,
        ffn_hidden_size: args["ffn_hidden_size"].as_u64().map(|v| v as usize),
        max_position_embeddings: ckpt.entry("embedding.position_embeddings.weight")?.global_shape[0],
        // An import keeps config.json's size; a pretrained model has the tokenizer's.
        vocab_size: args["hf_vocab_size"].as_u64().map_or(tokenizer.vocab_size(), |v| v as usize),
        make_vocab_size_divisible_by: args["make_vocab_size_divisible_by"].as_u64().unwrap_or(128) as usize,
        num_tokentypes: if has("embedding.tokentype_embeddings.weight") {
            ckpt.entry("embedding.tokentype_embeddings.weight")?.global_shape[0]
        } else {
            0
        },
        bert_binary_head: has("binary_head.weight"),
        layernorm: if has("embedding.layernorm.weight") { LayerNormPlacement::Post } else { LayerNormPlacement::Pre },
        gelu_erf: args["bert_gelu_erf"].as_bool().unwrap_or(false),
        layernorm_epsilon: args["norm_epsilon"].as_f64().unwrap_or(1e-5) as f32,
        hidden_dropout: dropout[0],
        attention_dropout: dropout[1],
        ..Default::default()
    };
    let padded = ckpt.entry("embedding.word_embeddings.weight")?.global_shape[0];
    if config.padded_vocab_size(1)? != padded {
        bail!(
            "checkpoint {}: the word embedding has {padded} rows, but the tokenizer's {} ids pad to {} \
             (wrong --vocab-file?)",
            dir.display(),
            config.vocab_size,
            config.padded_vocab_size(1)?
        );
    }
    let backend: Arc<dyn Backend> =
        registry.backend(&flags.backend, json!({ "threads": flags.threads })).context("building the backend")?;
    let mut model = BertModel::new(config, backend.clone(), ParallelContext::single())?;
    {
        let mut params = model.params_mut();
        ckpt.load_params(&mut params, backend.as_ref())
            .with_context(|| format!("loading weights from {}", dir.display()))?;
    }
    Ok(LoadedBert { model, tokenizer, args, iteration: ckpt.iteration() })
}

/// `megatron export hf` of a `bert` checkpoint: `config.json`, `model.safetensors` (f32),
/// `vocab.txt` and `tokenizer_config.json`, written to a temporary directory renamed into `out`.
pub fn export(flags: &LoadArgs, out: &Path, registry: &Registry) -> Result<()> {
    let loaded = load_bert_checkpoint(registry, flags, [0.0, 0.0])?;
    let tensors = export_hf_bert(&loaded.model)?;
    let parent = out.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).with_context(|| format!("cannot create {}", parent.display()))?;
    let name = out.file_name().context("--out needs a directory name")?.to_string_lossy().to_string();
    let tmp = parent.join(format!(".{name}.tmp-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
    write_synced(&tmp.join("model.safetensors"), &super::export::safetensors_bytes(&tensors)?)?;
    let config = hf_bert_config(&loaded.model);
    write_synced(&tmp.join("config.json"), serde_json::to_string_pretty(&config)?.as_bytes())?;
    let vocab = flags
        .vocab_file
        .clone()
        .or_else(|| loaded.args["vocab_file"].as_str().map(PathBuf::from))
        .context("the checkpoint's args name no vocab_file; pass --vocab-file")?;
    let bytes = std::fs::read(&vocab).with_context(|| format!("reading {}", vocab.display()))?;
    write_synced(&tmp.join("vocab.txt"), &bytes)?;
    let lower = loaded.tokenizer.name() != "BertWordPieceCase";
    let tok = json!({ "tokenizer_class": "BertTokenizer", "do_lower_case": lower });
    write_synced(&tmp.join("tokenizer_config.json"), serde_json::to_string_pretty(&tok)?.as_bytes())?;
    finish_export(&tmp, out)?;
    println!(
        "exported BERT iteration {} of {} to {} ({} tensors, {})",
        loaded.iteration,
        flags.load.display(),
        out.display(),
        tensors.len(),
        config["architectures"][0]
    );
    Ok(())
}

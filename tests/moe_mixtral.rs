//! Mixtral import (issue 17): a tiny random `MixtralForCausalLM` made by transformers at test
//! time (`scripts/mixtral_tiny.py`, /work/venv/bin/python or $MEGATRON_PYTHON) is loaded
//! into a GPT whose MLP slots the `moe` plugin fills; its logits equal transformers' within
//! 1e-4 of the largest logit, exporting back gives every HF tensor bit-identically, and
//! `megatron import hf` writes a checkpoint holding exactly the loaded weights (also from the
//! same weights split into two shards with an index), which
//! `megatron export hf` turns back into the original tensors (bit-identical) and from which
//! `megatron generate` decodes greedily the tokens transformers does.
//! Skips when the Python environment (torch + transformers) is absent.

use megatron::hf::import_mixtral::{export_hf_mixtral, load_hf_mixtral, mixtral_configs};
use megatron_core::registry::ModelEnv;
use megatron_core::{DType, HostBuffer, ParallelContext, Param, Registry};
use safetensors::SafeTensors;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::Command;

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn python() -> Option<String> {
    let py = std::env::var("MEGATRON_PYTHON").unwrap_or_else(|_| "/work/venv/bin/python".into());
    let ok = Command::new(&py).args(["-c", "import torch, transformers"]).output().is_ok_and(|o| o.status.success());
    if ok {
        Some(py)
    } else {
        println!("SKIP: {py} with torch + transformers is absent (set MEGATRON_PYTHON)");
        None
    }
}

/// The registry with the `moe` plugin: linked (feature `moe`) or the debug cdylib.
fn registry() -> Registry {
    let mut reg = Registry::builtin().unwrap();
    if !cfg!(feature = "moe") {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = Command::new(cargo).current_dir(workspace()).args(["build", "-q", "-p", "megatron-moe"]).status();
        assert!(status.is_ok_and(|s| s.success()), "cargo build -p megatron-moe failed");
        let target =
            std::env::var("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|_| workspace().join("target"));
        reg.load_library(&target.join("debug").join("libmegatron_moe.so")).unwrap();
    }
    reg
}

#[test]
fn tiny_mixtral_logits_match_transformers_and_export_round_trips() {
    let Some(py) = python() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let out = Command::new(&py).arg(workspace().join("scripts/mixtral_tiny.py")).arg(dir).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let cfg_path = dir.join("config.json");
    let cfg: Value = serde_json::from_slice(&std::fs::read(&cfg_path).unwrap()).unwrap();
    let (gpt, moe) = mixtral_configs(&cfg, &cfg_path, 1).unwrap();
    let experts = moe["num_experts"].as_u64().unwrap() as usize;

    let reg = registry();
    let backend = reg.backend("cpu", json!({})).unwrap();
    let env = ModelEnv {
        backend: backend.clone(),
        ctx: ParallelContext::single(),
        mlp: Some(reg.mlp_provider("moe", moe).unwrap()),
    };
    let mut model = reg.model("gpt", serde_json::to_value(&gpt).unwrap(), &env).unwrap();
    let blob = std::fs::read(dir.join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&blob).unwrap();
    let read = |name: &str| -> (Vec<f32>, Vec<usize>) {
        let v = st.tensor(name).unwrap_or_else(|e| panic!("{name}: {e}"));
        (HostBuffer::from_le_bytes(DType::F32, v.data()).unwrap().to_f32_vec(), v.shape().to_vec())
    };
    load_hf_mixtral(model.as_mut(), &gpt, experts, &mut |n| Ok(read(n))).unwrap();

    let reference: Value = serde_json::from_slice(&std::fs::read(dir.join("reference.json")).unwrap()).unwrap();
    let ids: Vec<i32> = reference["ids"].as_array().unwrap().iter().map(|v| v.as_i64().unwrap() as i32).collect();
    let want: Vec<f64> = reference["logits"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
    let vocab = reference["vocab"].as_u64().unwrap() as usize;
    let t = ids.len();
    let logits = backend.to_host(&model.logits(&ids, 1, t).unwrap()).unwrap().to_f32_vec();
    let vp = logits.len() / t;
    let scale = want.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    let mut worst = 0.0f64;
    for pos in 0..t {
        for v in 0..vocab {
            worst = worst.max((logits[pos * vp + v] as f64 - want[pos * vocab + v]).abs());
        }
    }
    println!("max |logit - transformers| = {worst:.3e} (largest logit {scale:.3})");
    assert!(worst <= 1e-4 * scale, "logits differ from transformers by {worst} (largest {scale})");

    // Export: every HF tensor back, bit for bit.
    let exported = export_hf_mixtral(model.as_ref(), &gpt, experts, vocab).unwrap();
    assert_eq!(exported.len(), st.names().len(), "tensor count");
    for (name, shape, data) in exported {
        let (d, s) = read(&name);
        assert_eq!(s, shape, "{name} shape");
        assert!(d.iter().zip(&data).all(|(a, b)| a.to_bits() == b.to_bits()), "{name} differs after export");
    }

    // `megatron import hf` on the same directory writes exactly these weights.
    let save = dir.join("ckpt");
    let out = Command::new(env!("CARGO_BIN_EXE_megatron"))
        .args(plugin_args())
        .args(["import", "hf", "--hf-dir"])
        .arg(dir)
        .arg("--save")
        .arg(&save)
        .args(["--make-vocab-size-divisible-by", "1"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let ckpt = megatron_checkpoint::load(&save, None).unwrap();
    assert_eq!(ckpt.metadata.meta.args["num_experts"], json!(experts));
    let mut loaded: Vec<Param> = model
        .params()
        .iter()
        .map(|p| Param {
            name: p.name.clone(),
            value: backend.zeros(p.value.shape(), DType::F32).unwrap(),
            grad: backend.zeros(&[0], DType::F32).unwrap(),
            layout: p.layout.clone(),
        })
        .collect();
    let mut refs: Vec<&mut Param> = loaded.iter_mut().collect();
    ckpt.load_params(&mut refs, backend.as_ref()).unwrap();
    for (a, b) in loaded.iter().zip(model.params()) {
        assert_eq!(a.value.host_f32().unwrap(), b.value.host_f32().unwrap(), "{} in the imported checkpoint", a.name);
    }

    // The same weights as two shards + `model.safetensors.index.json` (how transformers saves
    // models above its shard size): the import writes the same checkpoint tensors.
    let sharded = dir.join("sharded");
    std::fs::create_dir(&sharded).unwrap();
    std::fs::copy(&cfg_path, sharded.join("config.json")).unwrap();
    let mut names: Vec<&String> = st.names();
    names.sort();
    let mut weight_map = serde_json::Map::new();
    for (i, part) in names.chunks(names.len().div_ceil(2)).enumerate() {
        let file = format!("model-{:05}-of-00002.safetensors", i + 1);
        let views: Vec<(&str, safetensors::tensor::TensorView)> =
            part.iter().map(|n| (n.as_str(), st.tensor(n).unwrap())).collect();
        std::fs::write(sharded.join(&file), safetensors::serialize(views, &None).unwrap()).unwrap();
        for n in part {
            weight_map.insert(n.to_string(), json!(file));
        }
    }
    let index = json!({ "metadata": {}, "weight_map": weight_map });
    std::fs::write(sharded.join("model.safetensors.index.json"), serde_json::to_vec(&index).unwrap()).unwrap();
    let save_sharded = dir.join("ckpt-sharded");
    let out = Command::new(env!("CARGO_BIN_EXE_megatron"))
        .args(plugin_args())
        .args(["import", "hf", "--hf-dir"])
        .arg(&sharded)
        .arg("--save")
        .arg(&save_sharded)
        .args(["--make-vocab-size-divisible-by", "1"])
        .output()
        .unwrap();
    assert!(out.status.success(), "sharded import: {}", String::from_utf8_lossy(&out.stderr));
    let ckpt2 = megatron_checkpoint::load(&save_sharded, None).unwrap();
    let stored: Vec<&str> = ckpt.tensor_names().collect();
    assert_eq!(stored, ckpt2.tensor_names().collect::<Vec<_>>(), "tensor names of the sharded import");
    for name in stored {
        let (a, b) = (ckpt.tensor(name).unwrap(), ckpt2.tensor(name).unwrap());
        assert!(a.1 == b.1 && a.0.to_le_bytes() == b.0.to_le_bytes(), "{name} differs in the sharded import");
    }

    // `megatron export hf` of that checkpoint: a Mixtral directory with every tensor of the
    // original bit for bit, and the original's config values.
    let exported = dir.join("exported");
    let out = Command::new(env!("CARGO_BIN_EXE_megatron"))
        .args(plugin_args())
        .args(["export", "hf", "--load"])
        .arg(&save)
        .arg("--out")
        .arg(&exported)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let blob2 = std::fs::read(exported.join("model.safetensors")).unwrap();
    let st2 = SafeTensors::deserialize(&blob2).unwrap();
    assert_eq!(st2.names().len(), st.names().len(), "exported tensor count");
    for name in st.names() {
        let (a, b) = (st.tensor(name).unwrap(), st2.tensor(name).unwrap_or_else(|e| panic!("exported {name}: {e}")));
        assert_eq!((a.dtype(), a.shape()), (b.dtype(), b.shape()), "{name}");
        assert!(a.data() == b.data(), "{name} is not bit-identical after import + export");
    }
    let cfg2: Value = serde_json::from_slice(&std::fs::read(exported.join("config.json")).unwrap()).unwrap();
    assert_eq!(cfg2["model_type"], json!("mixtral"));
    assert_eq!(cfg2["architectures"], json!(["MixtralForCausalLM"]));
    for key in [
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "num_local_experts",
        "num_experts_per_tok",
        "rms_norm_eps",
        "tie_word_embeddings",
        "max_position_embeddings",
    ] {
        assert_eq!(cfg2[key].as_f64(), cfg[key].as_f64(), "config.json `{key}`: {} vs {}", cfg2[key], cfg[key]);
    }
    let theta = |c: &Value| c["rope_theta"].as_f64().or_else(|| c["rope_parameters"]["rope_theta"].as_f64());
    assert_eq!(theta(&cfg2), theta(&cfg), "rope_theta");

    // `megatron generate` from the MoE checkpoint: greedy tokens equal transformers' greedy
    // decode of the same prompt (ids, NullTokenizer), with the kv cache and without.
    let want: Vec<i64> = reference["greedy"].as_array().unwrap().iter().map(|v| v.as_i64().unwrap()).collect();
    let prompt = ids.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(" ");
    for cache in [&[][..], &["--no-kv-cache"][..]] {
        let out = Command::new(env!("CARGO_BIN_EXE_megatron"))
            .args(plugin_args())
            .args(["generate", "--load"])
            .arg(&save)
            .args(["--prompt", &prompt, "--tokens-to-generate", &want.len().to_string(), "--top-k", "1"])
            .args(cache)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8_lossy(&out.stdout);
        let got: Vec<i64> = text.split_whitespace().filter_map(|w| w.parse().ok()).collect();
        assert_eq!(got.len(), ids.len() + want.len(), "generate printed {text:?}");
        assert_eq!(&got[ids.len()..], &want[..], "greedy tokens {cache:?} vs transformers; printed {text:?}");
    }
}

/// `--plugin <debug cdylib>` for the binary unless it links the plugin (feature `moe`).
fn plugin_args() -> Vec<PathBuf> {
    if cfg!(feature = "moe") {
        return Vec::new();
    }
    let target = std::env::var("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|_| workspace().join("target"));
    vec!["--plugin".into(), target.join("debug").join("libmegatron_moe.so")]
}

//! Hugging Face's rotary settings in `config.json` ⇄ our [`RopeScaling`] and rotary base.
//!
//! transformers 4.x writes `rope_theta` and `rope_scaling` (`{"rope_type"|"type": "llama3" |
//! "linear", "factor", ...}`); 5.x writes one `rope_parameters` object that also holds
//! `rope_theta`. Both are read; the export writes the 4.x keys, which 5.x still loads.

use anyhow::{bail, Result};
use megatron_core::RopeScaling;
use serde_json::{json, Value};

/// `(rope_theta, scaling)` of an HF `config.json` (`what` names the file in errors).
pub fn rope_from_hf_config(cfg: &Value, what: &str) -> Result<(f32, RopeScaling)> {
    let params = if cfg["rope_parameters"].is_object() { &cfg["rope_parameters"] } else { &cfg["rope_scaling"] };
    let theta = cfg["rope_theta"].as_f64().or_else(|| params["rope_theta"].as_f64()).unwrap_or(10000.0) as f32;
    if params.is_null() {
        return Ok((theta, RopeScaling::None));
    }
    let ty = params["rope_type"].as_str().or_else(|| params["type"].as_str()).unwrap_or("default");
    let num = |key: &str| -> Result<f64> {
        match params[key].as_f64() {
            Some(v) => Ok(v),
            None => bail!("{what}: rope scaling `{ty}` has no number `{key}` in {params}"),
        }
    };
    let scaling = match ty {
        "default" => RopeScaling::None,
        "linear" => RopeScaling::Linear { factor: num("factor")? as f32 },
        "llama3" => RopeScaling::Llama3 {
            factor: num("factor")? as f32,
            low_freq_factor: num("low_freq_factor")? as f32,
            high_freq_factor: num("high_freq_factor")? as f32,
            original_max_position_embeddings: num("original_max_position_embeddings")? as usize,
        },
        other => bail!(
            "{what}: rope scaling type `{other}` is not supported (supported: default, linear, llama3); \
             the model cannot be imported exactly"
        ),
    };
    scaling.validate().map_err(|e| anyhow::anyhow!("{what}: {e}"))?;
    Ok((theta, scaling))
}

/// The `rope_scaling` value of an HF `config.json` (`null` when unscaled).
pub fn rope_scaling_to_hf(scaling: &RopeScaling) -> Value {
    match *scaling {
        RopeScaling::None => Value::Null,
        RopeScaling::Linear { factor } => json!({ "rope_type": "linear", "factor": factor }),
        RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position_embeddings } => json!({
            "rope_type": "llama3",
            "factor": factor,
            "low_freq_factor": low_freq_factor,
            "high_freq_factor": high_freq_factor,
            "original_max_position_embeddings": original_max_position_embeddings,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_transformers_layouts_read_and_the_export_reads_back() {
        let v4 = json!({"rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", "factor": 32.0,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}});
        let v5 = json!({"rope_parameters": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192, "rope_theta": 500000.0}});
        let want = RopeScaling::Llama3 {
            factor: 32.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192,
        };
        assert_eq!(rope_from_hf_config(&v4, "v4").unwrap(), (500000.0, want));
        assert_eq!(rope_from_hf_config(&v5, "v5").unwrap(), (500000.0, want));
        let back = json!({"rope_theta": 500000.0, "rope_scaling": rope_scaling_to_hf(&want)});
        assert_eq!(rope_from_hf_config(&back, "back").unwrap(), (500000.0, want));
        let linear = json!({"rope_scaling": {"type": "linear", "factor": 2.0}});
        assert_eq!(rope_from_hf_config(&linear, "l").unwrap(), (10000.0, RopeScaling::Linear { factor: 2.0 }));
        let plain = json!({"rope_parameters": {"rope_type": "default", "rope_theta": 100.0}});
        assert_eq!(rope_from_hf_config(&plain, "p").unwrap(), (100.0, RopeScaling::None));
        let yarn = json!({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}});
        let e = rope_from_hf_config(&yarn, "cfg.json").unwrap_err().to_string();
        assert!(e.contains("cfg.json") && e.contains("yarn"), "{e}");
        let bad = json!({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}});
        assert!(rope_from_hf_config(&bad, "c").unwrap_err().to_string().contains("low_freq_factor"));
    }
}

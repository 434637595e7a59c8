//! `megatron generate --chat`: the prompt becomes a one-turn conversation rendered with the
//! model's chat template (Jinja, as Hugging Face's `apply_chat_template` with
//! `add_generation_prompt=True`), rendered by `minijinja` (feature `huggingface`).
//!
//! The template comes from `--chat-template FILE`, else from `tokenizer_config.json` beside
//! the checkpoint's `tokenizer.json` (`megatron import gguf` writes the GGUF's
//! `tokenizer.chat_template` there).

use anyhow::{bail, Context, Result};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// The chat template of a checkpoint whose args are `args`, or of `file`.
pub fn find_template(file: Option<&Path>, args: &Value) -> Result<String> {
    if let Some(f) = file {
        return std::fs::read_to_string(f).with_context(|| format!("reading --chat-template {}", f.display()));
    }
    let Some(model) = args["tokenizer_model"].as_str().map(PathBuf::from) else {
        bail!("--chat needs a chat template: the checkpoint has no tokenizer_model; pass --chat-template FILE");
    };
    let dir = if model.is_dir() { model } else { model.parent().map(Path::to_path_buf).unwrap_or_default() };
    let cfg_path = dir.join("tokenizer_config.json");
    let text = std::fs::read_to_string(&cfg_path).with_context(|| {
        format!("reading {} for the chat template (or pass --chat-template FILE)", cfg_path.display())
    })?;
    let cfg: Value =
        serde_json::from_str(&text).with_context(|| format!("{} is not valid JSON", cfg_path.display()))?;
    match &cfg["chat_template"] {
        Value::String(s) => Ok(s.clone()),
        _ => bail!("{} has no `chat_template` string; pass --chat-template FILE", cfg_path.display()),
    }
}

/// `template` applied to `[{system}, {user: prompt}]` with a generation prompt.
#[cfg(feature = "huggingface")]
pub fn render(template: &str, system: Option<&str>, prompt: &str, bos: &str, eos: &str) -> Result<String> {
    let mut env = minijinja::Environment::new();
    env.add_function("raise_exception", |msg: String| -> std::result::Result<String, minijinja::Error> {
        Err(minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, msg))
    });
    env.add_template("chat", template).map_err(|e| anyhow::anyhow!("the chat template does not parse: {e:#}"))?;
    let mut messages = Vec::new();
    if let Some(s) = system {
        messages.push(serde_json::json!({"role": "system", "content": s}));
    }
    messages.push(serde_json::json!({"role": "user", "content": prompt}));
    let ctx = minijinja::context! {
        messages => messages, add_generation_prompt => true, bos_token => bos, eos_token => eos,
    };
    let t = env.get_template("chat").map_err(|e| anyhow::anyhow!("{e:#}"))?;
    t.render(ctx).map_err(|e| anyhow::anyhow!("rendering the chat template: {e:#}"))
}

/// `template` applied to chat `messages` (`{role, content}` objects) with a generation prompt.
#[cfg(feature = "huggingface")]
pub fn render_messages(template: &str, messages: &[serde_json::Value], bos: &str, eos: &str) -> Result<String> {
    let mut env = minijinja::Environment::new();
    env.add_function("raise_exception", |msg: String| -> std::result::Result<String, minijinja::Error> {
        Err(minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, msg))
    });
    env.add_template("chat", template).map_err(|e| anyhow::anyhow!("the chat template does not parse: {e:#}"))?;
    let ctx = minijinja::context! {
        messages => messages, add_generation_prompt => true, bos_token => bos, eos_token => eos,
    };
    let t = env.get_template("chat").map_err(|e| anyhow::anyhow!("{e:#}"))?;
    t.render(ctx).map_err(|e| anyhow::anyhow!("rendering the chat template: {e:#}"))
}

#[cfg(not(feature = "huggingface"))]
pub fn render_messages(_: &str, _: &[serde_json::Value], _: &str, _: &str) -> Result<String> {
    bail!("chat templates need the `huggingface` feature; rebuild with --features huggingface")
}

#[cfg(not(feature = "huggingface"))]
pub fn render(_: &str, _: Option<&str>, _: &str, _: &str, _: &str) -> Result<String> {
    bail!("--chat needs the `huggingface` feature (chat templates and tokenizer.json); rebuild with --features huggingface")
}

#[cfg(all(test, feature = "huggingface"))]
mod tests {
    use super::*;

    #[test]
    fn chatml_template_renders_a_generation_prompt() {
        let t = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}\
                 {{ '<|im_start|>system\nYou are helpful<|im_end|>\n' }}{% endif %}\
                 {{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}\
                 {% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";
        let s = render(t, None, "Hi?", "", "").unwrap();
        assert_eq!(
            s,
            "<|im_start|>system\nYou are helpful<|im_end|>\n<|im_start|>user\nHi?<|im_end|>\n<|im_start|>assistant\n"
        );
        let s = render(t, Some("Be brief"), "Hi?", "", "").unwrap();
        assert!(s.starts_with("<|im_start|>system\nBe brief<|im_end|>\n"), "{s}");
        assert!(render("{{ raise_exception('no') }}", None, "x", "", "").is_err());
    }
}

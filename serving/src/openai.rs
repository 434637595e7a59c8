//! The OpenAI protocol: request parsing and validation for `/v1/completions` and
//! `/v1/chat/completions`, and OpenAI-style error objects
//! `{"error": {"message", "type", "param", "code"}}`.
//!
//! Fields: `model`, `prompt` (string, strings, token ids, lists of token ids) or `messages`,
//! `max_tokens` (`max_completion_tokens`), `temperature` (0 = greedy), `top_p`, `top_k` (an
//! extension, as vLLM), `n`, `stop` (string or up to 4), `seed`, `logprobs` (completions: 0–5
//! alternatives; chat: bool with `top_logprobs` 0–20), `echo` (completions), `stream`,
//! `stream_options.include_usage`, `user`. Zero penalties, `best_of: 1` and an empty
//! `logit_bias` are accepted; anything else is refused by name.

use crate::sampling::SamplingParams;
use serde_json::{json, Map, Value};

/// An error answered as `{"error": {...}}` with `status`.
#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

impl ApiError {
    pub fn new(status: u16, message: impl Into<String>) -> ApiError {
        let kind = match status {
            401 => "authentication_error",
            404 => "not_found_error",
            429 => "rate_limit_error",
            500 | 503 => "server_error",
            _ => "invalid_request_error",
        };
        ApiError { status, message: message.into(), kind, param: None, code: None }
    }

    /// A 400 about one request field.
    pub fn param(param: &str, message: impl Into<String>) -> ApiError {
        ApiError { param: Some(param.to_string()), ..ApiError::new(400, message) }
    }

    pub fn code(mut self, code: &'static str) -> ApiError {
        self.code = Some(code);
        self
    }

    pub fn body(&self) -> Value {
        json!({ "error": { "message": self.message, "type": self.kind, "param": self.param, "code": self.code } })
    }
}

/// A prompt as text or as token ids.
#[derive(Clone, Debug, PartialEq)]
pub enum Prompt {
    Text(String),
    Ids(Vec<i32>),
}

/// The settings shared by both endpoints.
#[derive(Clone, Debug, PartialEq)]
pub struct Common {
    pub model: Option<String>,
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    pub n: usize,
    pub stop: Vec<String>,
    pub seed: Option<u64>,
    /// Alternatives per token, if log-probs were asked for.
    pub logprobs: Option<usize>,
    pub stream: bool,
    pub include_usage: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub struct CompletionRequest {
    pub prompts: Vec<Prompt>,
    pub echo: bool,
    pub common: Common,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ChatRequest {
    /// `{"role", "content"}` objects (content as text).
    pub messages: Vec<Value>,
    pub common: Common,
}

/// Limits a request must respect.
#[derive(Clone, Debug)]
pub struct RequestLimits {
    pub max_tokens: usize,
    pub max_n: usize,
    pub max_prompts: usize,
}

impl Default for RequestLimits {
    fn default() -> Self {
        RequestLimits { max_tokens: 4096, max_n: 16, max_prompts: 64 }
    }
}

fn object(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::new(400, format!("request body is not valid JSON: {e}")).code("invalid_json"))?;
    match v {
        Value::Object(m) => Ok(m),
        _ => Err(ApiError::new(400, "request body must be a JSON object")),
    }
}

fn uint(m: &Map<String, Value>, key: &str, default: u64, max: u64) -> Result<u64, ApiError> {
    match m.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(v) => match v.as_u64() {
            Some(x) if x <= max => Ok(x),
            _ => Err(ApiError::param(key, format!("`{key}` must be an integer in [0, {max}], got {v}"))),
        },
    }
}

fn float(m: &Map<String, Value>, key: &str, default: f64, lo: f64, hi: f64) -> Result<f64, ApiError> {
    match m.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(v) => match v.as_f64() {
            Some(x) if (lo..=hi).contains(&x) => Ok(x),
            _ => Err(ApiError::param(key, format!("`{key}` must be a number in [{lo}, {hi}], got {v}"))),
        },
    }
}

fn boolean(m: &Map<String, Value>, key: &str) -> Result<bool, ApiError> {
    match m.get(key) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(v) => Err(ApiError::param(key, format!("`{key}` must be a boolean, got {v}"))),
    }
}

const COMMON_KEYS: &[&str] = &[
    "model",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "n",
    "stop",
    "seed",
    "logprobs",
    "stream",
    "stream_options",
    "user",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "best_of",
];

fn common(m: &Map<String, Value>, extra: &[&str], chat: bool, lim: &RequestLimits) -> Result<Common, ApiError> {
    if let Some(k) = m.keys().find(|k| !COMMON_KEYS.contains(&k.as_str()) && !extra.contains(&k.as_str())) {
        return Err(ApiError::param(k, format!("unknown or unsupported field `{k}`")));
    }
    for key in ["presence_penalty", "frequency_penalty"] {
        if float(m, key, 0.0, -2.0, 2.0)? != 0.0 {
            return Err(ApiError::param(key, format!("`{key}` is not supported (only 0)")));
        }
    }
    if uint(m, "best_of", 1, 1)? != 1 {
        return Err(ApiError::param("best_of", "`best_of` is not supported (only 1)"));
    }
    if m.get("logit_bias").is_some_and(|v| !v.is_null() && v.as_object().is_none_or(|o| !o.is_empty())) {
        return Err(ApiError::param("logit_bias", "`logit_bias` is not supported"));
    }
    if let Some(v) = m.get("model").filter(|v| !v.is_null() && !v.is_string()) {
        return Err(ApiError::param("model", format!("`model` must be a string, got {v}")));
    }
    let model = m.get("model").and_then(Value::as_str).map(String::from);
    let default_max = if chat { lim.max_tokens.min(256) } else { 16 };
    let mt_key = if m.contains_key("max_completion_tokens") { "max_completion_tokens" } else { "max_tokens" };
    let max_tokens = uint(m, mt_key, default_max as u64, lim.max_tokens as u64)? as usize;
    let temperature = float(m, "temperature", 1.0, 0.0, 2.0)?;
    let top_p = float(m, "top_p", 1.0, 0.0, 1.0)?;
    if top_p == 0.0 {
        return Err(ApiError::param("top_p", "`top_p` must be > 0 (use temperature 0 for greedy decoding)"));
    }
    let top_k = uint(m, "top_k", 0, 1000)? as usize;
    if top_k > 1 && top_p < 1.0 {
        return Err(ApiError::param("top_k", "`top_k` and `top_p` < 1 cannot be combined; give one of them"));
    }
    let sampling = if temperature == 0.0 || top_k == 1 {
        SamplingParams::greedy()
    } else {
        if (temperature as f32) < f32::MIN_POSITIVE {
            return Err(ApiError::param("temperature", "`temperature` is too small; use 0 for greedy decoding"));
        }
        let top_p = if top_p >= 1.0 { 0.0 } else { top_p as f32 };
        SamplingParams { temperature: temperature as f32, top_k, top_p, ..SamplingParams::default() }
    };
    let n = uint(m, "n", 1, lim.max_n as u64)? as usize;
    if n == 0 {
        return Err(ApiError::param("n", "`n` must be at least 1"));
    }
    let stop = match m.get("stop") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) if a.len() <= 4 && a.iter().all(Value::is_string) => {
            a.iter().filter_map(|s| s.as_str().map(String::from)).collect()
        }
        Some(v) => return Err(ApiError::param("stop", format!("`stop` must be a string or up to 4 strings, got {v}"))),
    };
    if stop.iter().any(|s| s.is_empty() || s.len() > 256) {
        return Err(ApiError::param("stop", "stop sequences must be 1 to 256 bytes"));
    }
    let seed = match m.get("seed") {
        None | Some(Value::Null) => None,
        Some(v) => match (v.as_u64(), v.as_i64()) {
            (Some(s), _) => Some(s),
            (None, Some(s)) => Some(s as u64), // negative seeds are fine: any 64-bit pattern
            _ => return Err(ApiError::param("seed", format!("`seed` must be an integer, got {v}"))),
        },
    };
    let logprobs = if chat {
        let top = uint(m, "top_logprobs", 0, 20)? as usize;
        match (boolean(m, "logprobs")?, m.get("top_logprobs").is_some_and(|v| !v.is_null())) {
            (true, _) => Some(top),
            (false, true) => return Err(ApiError::param("top_logprobs", "`top_logprobs` needs `logprobs: true`")),
            (false, false) => None,
        }
    } else {
        match m.get("logprobs") {
            None | Some(Value::Null) => None,
            Some(_) => Some(uint(m, "logprobs", 0, 5)? as usize),
        }
    };
    let stream = boolean(m, "stream")?;
    let include_usage = match m.get("stream_options") {
        None | Some(Value::Null) => false,
        Some(Value::Object(o)) if o.keys().all(|k| k == "include_usage") => {
            o.get("include_usage").and_then(Value::as_bool).unwrap_or(false)
        }
        Some(v) => return Err(ApiError::param("stream_options", format!("unsupported `stream_options` {v}"))),
    };
    if m.get("user").is_some_and(|v| !v.is_string() && !v.is_null()) {
        return Err(ApiError::param("user", "`user` must be a string"));
    }
    Ok(Common { model, max_tokens, sampling, n, stop, seed, logprobs, stream, include_usage })
}

fn ids(a: &[Value]) -> Option<Vec<i32>> {
    a.iter().map(|v| v.as_i64().filter(|&x| (0..=i32::MAX as i64).contains(&x)).map(|x| x as i32)).collect()
}

/// Parses a `/v1/completions` body.
pub fn parse_completion(body: &[u8], lim: &RequestLimits) -> Result<CompletionRequest, ApiError> {
    let m = object(body)?;
    let common = common(&m, &["prompt", "echo", "suffix"], false, lim)?;
    if m.get("suffix").is_some_and(|v| !v.is_null()) {
        return Err(ApiError::param("suffix", "`suffix` is not supported"));
    }
    let bad =
        || ApiError::param("prompt", "`prompt` must be a string, a list of strings, token ids or lists of token ids");
    let prompts = match m.get("prompt") {
        None | Some(Value::Null) => return Err(ApiError::param("prompt", "`prompt` is required")),
        Some(Value::String(s)) => vec![Prompt::Text(s.clone())],
        Some(Value::Array(a)) if a.is_empty() => return Err(ApiError::param("prompt", "`prompt` is an empty list")),
        Some(Value::Array(a)) if a.iter().all(Value::is_string) => {
            a.iter().map(|s| Prompt::Text(s.as_str().unwrap_or_default().to_string())).collect()
        }
        Some(Value::Array(a)) if a.iter().all(Value::is_number) => vec![Prompt::Ids(ids(a).ok_or_else(bad)?)],
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| x.as_array().and_then(|x| ids(x)).map(Prompt::Ids).ok_or_else(bad))
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(bad()),
    };
    if prompts.len() > lim.max_prompts {
        return Err(ApiError::param("prompt", format!("at most {} prompts per request", lim.max_prompts)));
    }
    if prompts.len() * common.n > lim.max_prompts {
        return Err(ApiError::param("n", format!("prompts × n must be at most {}", lim.max_prompts)));
    }
    Ok(CompletionRequest { prompts, echo: boolean(&m, "echo")?, common })
}

/// Parses a `/v1/chat/completions` body (message contents: strings or lists of text parts).
pub fn parse_chat(body: &[u8], lim: &RequestLimits) -> Result<ChatRequest, ApiError> {
    let m = object(body)?;
    let common = common(&m, &["messages", "top_logprobs"], true, lim)?;
    let Some(Value::Array(list)) = m.get("messages") else {
        return Err(ApiError::param("messages", "`messages` (a list of {role, content}) is required"));
    };
    if list.is_empty() {
        return Err(ApiError::param("messages", "`messages` is empty"));
    }
    let mut messages = Vec::with_capacity(list.len());
    for (i, msg) in list.iter().enumerate() {
        let role = msg.get("role").and_then(Value::as_str);
        let Some(role @ ("system" | "user" | "assistant" | "developer")) = role else {
            return Err(ApiError::param(
                &format!("messages[{i}].role"),
                "role must be one of system, developer, user, assistant",
            ));
        };
        let content = match msg.get("content") {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(parts)) => parts
                .iter()
                .map(|p| match (p.get("type").and_then(Value::as_str), p.get("text").and_then(Value::as_str)) {
                    (Some("text"), Some(t)) => Ok(t),
                    _ => {
                        Err(ApiError::param(&format!("messages[{i}].content"), "only text content parts are supported"))
                    }
                })
                .collect::<Result<Vec<_>, _>>()?
                .concat(),
            _ => return Err(ApiError::param(&format!("messages[{i}].content"), "content must be a string")),
        };
        messages.push(json!({ "role": role, "content": content }));
    }
    if common.n > lim.max_prompts {
        return Err(ApiError::param("n", format!("`n` must be at most {}", lim.max_prompts)));
    }
    Ok(ChatRequest { messages, common })
}

/// A chat rendered without a model template: `role: content` lines and `assistant:`.
pub fn plain_chat_prompt(messages: &[Value]) -> String {
    let mut s = String::new();
    for m in messages {
        let (role, content) = (m["role"].as_str().unwrap_or(""), m["content"].as_str().unwrap_or(""));
        s.push_str(&format!("{role}: {content}\n"));
    }
    s.push_str("assistant:");
    s
}

/// Compares secrets in time independent of where they differ (the length still shows).
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = (a.len() ^ b.len()) as u8 | ((a.len() ^ b.len()) >> 8) as u8;
    for i in 0..a.len().max(b.len()) {
        diff |= a.get(i).copied().unwrap_or(0) ^ b.get(i).copied().unwrap_or(0xff);
    }
    diff == 0 && a.len() == b.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn comp(v: Value) -> Result<CompletionRequest, ApiError> {
        parse_completion(v.to_string().as_bytes(), &RequestLimits::default())
    }

    #[test]
    fn completion_fields_and_defaults() {
        let r = comp(json!({"model": "m", "prompt": "hi"})).unwrap();
        assert_eq!((r.common.max_tokens, r.common.n, r.echo, r.common.logprobs), (16, 1, false, None));
        assert_eq!(r.common.sampling, SamplingParams::default());
        let r =
            comp(json!({"prompt": [[1, 2], [3]], "temperature": 0, "stop": "\n", "logprobs": 2, "seed": -1})).unwrap();
        assert_eq!(r.prompts, vec![Prompt::Ids(vec![1, 2]), Prompt::Ids(vec![3])]);
        assert_eq!(r.common.sampling, SamplingParams::greedy());
        assert_eq!(
            (r.common.stop.clone(), r.common.logprobs, r.common.seed),
            (vec!["\n".into()], Some(2), Some(u64::MAX))
        );
        let r = comp(json!({"prompt": "x", "top_p": 0.5, "temperature": 0.7})).unwrap();
        assert_eq!((r.common.sampling.top_p, r.common.sampling.temperature), (0.5, 0.7));
    }

    #[test]
    fn completion_errors_name_the_field() {
        for (body, param) in [
            (json!({}), "prompt"),
            (json!({"prompt": []}), "prompt"),
            (json!({"prompt": [1.5]}), "prompt"),
            (json!({"prompt": "x", "max_tokens": -1}), "max_tokens"),
            (json!({"prompt": "x", "max_tokens": 100000}), "max_tokens"),
            (json!({"prompt": "x", "temperature": 3}), "temperature"),
            (json!({"prompt": "x", "top_p": 0}), "top_p"),
            (json!({"prompt": "x", "n": 0}), "n"),
            (json!({"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}), "stop"),
            (json!({"prompt": "x", "logprobs": 6}), "logprobs"),
            (json!({"prompt": "x", "presence_penalty": 1}), "presence_penalty"),
            (json!({"prompt": "x", "bogus": 1}), "bogus"),
            (json!({"prompt": "x", "top_k": 5, "top_p": 0.5}), "top_k"),
        ] {
            let e = comp(body.clone()).unwrap_err();
            assert_eq!((e.status, e.param.as_deref()), (400, Some(param)), "{body}: {e:?}");
            assert_eq!(e.body()["error"]["type"], "invalid_request_error");
        }
        assert_eq!(parse_completion(b"{", &RequestLimits::default()).unwrap_err().code, Some("invalid_json"));
    }

    #[test]
    fn chat_messages_and_logprobs() {
        let lim = RequestLimits::default();
        let body = json!({"messages": [{"role": "system", "content": "s"}, {"role": "user",
            "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
            "logprobs": true, "top_logprobs": 3});
        let r = parse_chat(body.to_string().as_bytes(), &lim).unwrap();
        assert_eq!((r.messages[1]["content"].as_str(), r.common.logprobs), (Some("ab"), Some(3)));
        assert_eq!(plain_chat_prompt(&r.messages), "system: s\nuser: ab\nassistant:");
        let bad = json!({"messages": [{"role": "robot", "content": "x"}]});
        assert_eq!(
            parse_chat(bad.to_string().as_bytes(), &lim).unwrap_err().param.as_deref(),
            Some("messages[0].role")
        );
        let bad = json!({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2});
        assert_eq!(parse_chat(bad.to_string().as_bytes(), &lim).unwrap_err().param.as_deref(), Some("top_logprobs"));
    }

    #[test]
    fn secrets_compare_exactly() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret!"));
        assert!(!constant_time_eq(b"", b"x"));
        assert!(constant_time_eq(b"", b""));
    }
}

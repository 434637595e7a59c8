//! The `PUT /api` request body of Megatron's text-generation server (SPEC §8.1): field names,
//! defaults and validation rules, with Megatron's error messages. Unknown fields are rejected
//! (Megatron ignores them; a typo silently changing nothing is worse than a 400).

use crate::generate::SamplingParams;
use serde_json::{Map, Value};

/// The smallest accepted temperature: the smallest normal `f32` (the sampler's type).
pub const MIN_TEMPERATURE: f32 = f32::MIN_POSITIVE;

/// Megatron's limit on prompts per request.
pub const MAX_PROMPTS: usize = 128;

const KNOWN: [&str; 17] = [
    "prompts",
    "tokens_to_generate",
    "logprobs",
    "temperature",
    "top_k",
    "top_p",
    "top_p_decay",
    "top_p_bound",
    "add_BOS",
    "stop_on_eol",
    "stop_on_double_eol",
    "prevent_newline_after_colon",
    "random_seed",
    "no_log",
    "stop_token",
    "length_penalty",
    "beam_width",
];

/// A validated request.
#[derive(Clone, Debug, PartialEq)]
pub struct ApiRequest {
    pub prompts: Vec<String>,
    pub tokens_to_generate: usize,
    pub logprobs: bool,
    pub sampling: SamplingParams,
    pub add_bos: bool,
    pub stop_on_eol: bool,
    pub stop_on_double_eol: bool,
    pub prevent_newline_after_colon: bool,
    /// `None` = the server picks one.
    pub random_seed: Option<u64>,
    pub no_log: bool,
    pub stop_token: i64,
}

fn boolean(m: &Map<String, Value>, key: &str) -> Result<bool, String> {
    match m.get(key) {
        None => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(format!("{key} must be a boolean value")),
    }
}

fn number(m: &Map<String, Value>, key: &str, default: f64) -> Result<Option<f64>, String> {
    match m.get(key) {
        None => Ok(None),
        Some(v) => v.as_f64().map(Some).ok_or_else(|| format!("{key} must be a number")),
    }
    .map(|v| v.or(Some(default)))
}

fn integer(m: &Map<String, Value>, key: &str) -> Result<Option<i64>, String> {
    match m.get(key) {
        None => Ok(None),
        Some(v) => v.as_i64().map(Some).ok_or_else(|| format!("{key} must be an integer")),
    }
}

/// Parses and validates a request body; the error is the message of the HTTP 400.
pub fn parse(body: &[u8]) -> Result<ApiRequest, String> {
    let v: Value = serde_json::from_slice(body).map_err(|e| format!("request body is not valid JSON: {e}"))?;
    let Value::Object(m) = v else { return Err("request body must be a JSON object".into()) };
    if m.contains_key("sentences") {
        return Err("sentences is no longer used.  Replace with prompts".into());
    }
    if m.contains_key("max_len") {
        return Err("max_len is no longer used.  Replace with tokens_to_generate".into());
    }
    if let Some(k) = m.keys().find(|k| !KNOWN.contains(&k.as_str())) {
        return Err(format!("unknown field `{k}`; accepted fields: {}", KNOWN.join(", ")));
    }
    let prompts = match m.get("prompts") {
        None => return Err("prompts argument required".into()),
        Some(Value::Array(a)) => a
            .iter()
            .map(|p| p.as_str().map(String::from))
            .collect::<Option<Vec<String>>>()
            .ok_or("prompts is not a list of strings")?,
        Some(_) => return Err("prompts is not a list of strings".into()),
    };
    if prompts.is_empty() {
        return Err("prompts is empty".into());
    }
    if prompts.len() > MAX_PROMPTS {
        return Err(format!("Maximum number of prompts is {MAX_PROMPTS}"));
    }
    let tokens_to_generate = match integer(&m, "tokens_to_generate")? {
        None => 64,
        Some(t) if t >= 0 => t as usize,
        Some(_) => return Err("tokens_to_generate must be an integer greater than or equal to 0".into()),
    };
    let logprobs = boolean(&m, "logprobs")?;
    if tokens_to_generate == 0 && !logprobs {
        return Err("tokens_to_generate=0 implies logprobs should be True".into());
    }
    // Checked in f32, the type the sampler uses: 1e-300 is > 0 as f64 but 0.0 as f32, and
    // dividing the logits by it gave garbage. Too-small values are rejected, not made greedy,
    // so the client learns that its setting did not do what it asked for.
    let temperature = number(&m, "temperature", 1.0)?.unwrap_or(1.0);
    if !(temperature > 0.0 && temperature <= 100.0) {
        return Err("temperature must be a positive number less than or equal to 100.0".into());
    }
    let temperature = temperature as f32;
    if temperature < MIN_TEMPERATURE {
        return Err(format!(
            "temperature {} is too small (below {MIN_TEMPERATURE:e}, the smallest normal 32-bit float); \
             for greedy decoding set top_k=1",
            m["temperature"]
        ));
    }
    let top_k = match integer(&m, "top_k")? {
        None => 0,
        Some(k) if (0..=1000).contains(&k) => k as usize,
        Some(_) => {
            return Err("top_k must be an integer equal to or greater than 0 and less than or equal to 1000".into())
        }
    };
    let top_p = number(&m, "top_p", 0.0)?.unwrap_or(0.0);
    if !(0.0..=1.0).contains(&top_p) {
        return Err("top_p must be a positive float less than or equal to 1.0".into());
    }
    if top_p > 0.0 && top_k > 0 {
        return Err("cannot set both top-k and top-p samplings.".into());
    }
    let top_p_decay = number(&m, "top_p_decay", 0.0)?.unwrap_or(0.0);
    if m.contains_key("top_p_decay") {
        if !(0.0..=1.0).contains(&top_p_decay) {
            return Err("top_p_decay must be a positive float less than or equal to 1.0".into());
        }
        if top_p == 0.0 {
            return Err("top_p_decay cannot be set without top_p".into());
        }
    }
    let top_p_bound = number(&m, "top_p_bound", 0.0)?.unwrap_or(0.0);
    if m.contains_key("top_p_bound") {
        if !(top_p_bound > 0.0 && top_p_bound <= top_p) {
            return Err("top_p_bound must be a positive float less than or equal to top_p".into());
        }
        if top_p == 0.0 {
            return Err("top_p_bound cannot be set without top_p".into());
        }
    }
    let add_bos = boolean(&m, "add_BOS")?;
    if prompts.iter().any(String::is_empty) && !add_bos {
        return Err("Empty prompts require add_BOS=true".into());
    }
    let random_seed = match integer(&m, "random_seed")? {
        None => None,
        Some(s) if s >= 0 => Some(s as u64),
        Some(_) => return Err("random_seed must be a positive integer".into()),
    };
    if m.contains_key("beam_width") {
        return Err("Beam search is no longer supported.".into());
    }
    number(&m, "length_penalty", 1.0)?;
    let stop_token = integer(&m, "stop_token")?.unwrap_or(50256);
    Ok(ApiRequest {
        prompts,
        tokens_to_generate,
        logprobs,
        sampling: SamplingParams {
            temperature,
            top_k,
            top_p: top_p as f32,
            top_p_decay: top_p_decay as f32,
            top_p_bound: top_p_bound as f32,
        },
        add_bos,
        stop_on_eol: boolean(&m, "stop_on_eol")?,
        stop_on_double_eol: boolean(&m, "stop_on_double_eol")?,
        prevent_newline_after_colon: boolean(&m, "prevent_newline_after_colon")?,
        random_seed,
        no_log: boolean(&m, "no_log")?,
        stop_token,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(body: &str) -> String {
        parse(body.as_bytes()).unwrap_err()
    }

    #[test]
    fn defaults_and_fields() {
        let r = parse(br#"{"prompts": ["a", "b"], "tokens_to_generate": 3, "top_p": 0.9, "top_p_decay": 0.5, "top_p_bound": 0.2, "random_seed": 7}"#).unwrap();
        assert_eq!(r.prompts, vec!["a", "b"]);
        assert_eq!((r.tokens_to_generate, r.random_seed, r.logprobs), (3, Some(7), false));
        assert_eq!(r.sampling.top_p_decay, 0.5);
        let d = parse(br#"{"prompts": ["x"]}"#).unwrap();
        assert_eq!((d.tokens_to_generate, d.sampling.temperature, d.sampling.top_k), (64, 1.0, 0));
    }

    #[test]
    fn validation_messages() {
        assert_eq!(err("{}"), "prompts argument required");
        assert_eq!(err(r#"{"prompts": "x"}"#), "prompts is not a list of strings");
        assert_eq!(err(r#"{"prompts": []}"#), "prompts is empty");
        assert_eq!(err(r#"{"sentences": ["x"]}"#), "sentences is no longer used.  Replace with prompts");
        assert_eq!(
            err(r#"{"prompts": ["x"], "max_len": 3}"#),
            "max_len is no longer used.  Replace with tokens_to_generate"
        );
        assert_eq!(
            err(r#"{"prompts": ["x"], "tokens_to_generate": 0}"#),
            "tokens_to_generate=0 implies logprobs should be True"
        );
        assert!(err(r#"{"prompts": ["x"], "temperature": 0}"#).starts_with("temperature must be"));
        for tiny in ["1e-300", "1e-39", "5e-45"] {
            let e = err(&format!(r#"{{"prompts": ["x"], "temperature": {tiny}}}"#));
            assert!(e.contains("too small") && e.contains("top_k=1"), "{e}");
        }
        assert_eq!(parse(br#"{"prompts": ["x"], "temperature": 1.2e-38}"#).unwrap().sampling.temperature, 1.2e-38);
        assert!(err(r#"{"prompts": ["x"], "top_k": 1001}"#).starts_with("top_k must be"));
        assert_eq!(
            err(r#"{"prompts": ["x"], "top_k": 5, "top_p": 0.5}"#),
            "cannot set both top-k and top-p samplings."
        );
        assert_eq!(err(r#"{"prompts": ["x"], "top_p_decay": 0.5}"#), "top_p_decay cannot be set without top_p");
        assert!(err(r#"{"prompts": ["x"], "top_p": 0.5, "top_p_bound": 0.6}"#).starts_with("top_p_bound must be"));
        assert_eq!(err(r#"{"prompts": [""]}"#), "Empty prompts require add_BOS=true");
        assert_eq!(err(r#"{"prompts": ["x"], "beam_width": 2}"#), "Beam search is no longer supported.");
        assert!(err(r#"{"prompts": ["x"], "bogus": 1}"#).contains("unknown field `bogus`"));
        assert_eq!(err(r#"{"prompts": ["x"], "logprobs": 1}"#), "logprobs must be a boolean value");
        assert!(err(r#"{"prompts": ["x"], "random_seed": -2}"#).starts_with("random_seed must be"));
        assert!(err("not json").starts_with("request body is not valid JSON"));
        let many = format!(r#"{{"prompts": [{}]}}"#, vec!["\"a\""; 129].join(","));
        assert_eq!(err(&many), "Maximum number of prompts is 128");
    }
}

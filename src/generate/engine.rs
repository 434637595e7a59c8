//! The generation loop (SPEC §8.2, Megatron's static batching): right-pad the prompts to
//! `max_prompt_len + tokens_to_generate`, prefill the common prefix `min_prompt_len`, then one
//! position at a time for every row, keeping a row's prompt token while it is still inside its
//! prompt and the sample afterwards. Rows stop at an end token (or the eol rules); the loop
//! stops when all rows have stopped or the length is reached.
//!
//! With the kv cache each step runs only the new position; without it (`use_kv_cache: false`)
//! every step recomputes the whole prefix (the reference path and the speed baseline).

use super::sampling::{log_prob, sample, SamplingParams};
use anyhow::{bail, Result};
use megatron_core::Model;
use megatron_gpt::{GptModel, SlotCall, SlotKvCache};
use megatron_serving::ranks::{Driver, Plan};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// GPT-2's `\n` and `\n\n` ids (the eol rules of SPEC §8.1 are defined on GPT-2 ids).
pub const EOL: i32 = 198;
pub const DOUBLE_EOL: i32 = 628;

/// Everything one generation call needs besides the prompts.
#[derive(Clone, Debug, PartialEq)]
pub struct GenerationParams {
    pub tokens_to_generate: usize,
    pub sampling: SamplingParams,
    /// Ids that end a row (the tokenizer's eod, plus any user stop tokens).
    pub stop_tokens: Vec<i32>,
    pub stop_on_eol: bool,
    pub stop_on_double_eol: bool,
    /// Forbid `\n` (198) right after this token id (the tokenizer's id of `:`).
    pub prevent_newline_after: Option<i32>,
    pub seed: u64,
    pub use_kv_cache: bool,
}

impl Default for GenerationParams {
    fn default() -> Self {
        GenerationParams {
            tokens_to_generate: 64,
            sampling: SamplingParams::default(),
            stop_tokens: Vec::new(),
            stop_on_eol: false,
            stop_on_double_eol: false,
            prevent_newline_after: None,
            seed: 0,
            use_kv_cache: true,
        }
    }
}

/// The result per row: prompt + generated tokens (up to and including the stop token), the
/// prompt length, and `log p(token | prefix)` of every token after the first.
#[derive(Clone, Debug, PartialEq)]
pub struct Generated {
    pub tokens: Vec<Vec<i32>>,
    pub prompt_lens: Vec<usize>,
    pub logprobs: Vec<Vec<f32>>,
}

/// Runs [`GenerationParams`] on a model; `vocab_size` is the tokenizer's (unpadded) vocabulary
/// and `pad_id` fills positions past a row's end (Megatron pads with eod).
pub struct Generator<'a> {
    pub model: &'a mut GptModel,
    pub vocab_size: usize,
    pub pad_id: i32,
}

impl Generator<'_> {
    /// Generates for every prompt (token ids, each non-empty). `on_token(row, id)` is called
    /// for every generated token as soon as it is chosen (streaming); returning `false` aborts
    /// the request (a disconnected client) with an error.
    pub fn generate(
        &mut self,
        prompts: &[Vec<i32>],
        p: &GenerationParams,
        on_token: &mut dyn FnMut(usize, i32) -> bool,
    ) -> Result<Generated> {
        let b = prompts.len();
        if b == 0 {
            bail!("no prompts to generate from");
        }
        if let Some(i) = prompts.iter().position(|x| x.is_empty()) {
            bail!("prompt {i} has no tokens (an empty prompt needs add_BOS)");
        }
        let lens: Vec<usize> = prompts.iter().map(Vec::len).collect();
        let (min_len, max_prompt) = (lens.iter().copied().min().unwrap_or(0), lens.iter().copied().max().unwrap_or(0));
        let total = max_prompt + p.tokens_to_generate;
        let max_pos = self.model.config().max_position_embeddings;
        if total > max_pos {
            bail!(
                "the longest prompt ({max_prompt} tokens) + tokens_to_generate ({}) = {total} exceeds the model's \
                 max_position_embeddings {max_pos}",
                p.tokens_to_generate
            );
        }
        let v_pad = self.model.padded_vocab_size();
        let vocab = self.vocab_size.min(v_pad);
        let mut tokens: Vec<Vec<i32>> = prompts
            .iter()
            .map(|x| {
                let mut row = x.clone();
                row.resize(total, self.pad_id);
                row
            })
            .collect();
        let mut logprobs = vec![Vec::new(); b];
        let mut end = vec![total; b]; // final length of each row
        let mut done = vec![false; b];

        // Scoring only: one pass over the prompts.
        let first = if p.tokens_to_generate == 0 { max_prompt } else { min_len };
        let mut steps = Stepper::new(self.model, b, total, p.use_kv_cache)?;
        let logits = steps.run(&tokens, 0, first)?;
        for (r, row_lp) in logprobs.iter_mut().enumerate() {
            for pos in 1..first.min(lens[r]) {
                let l = &logits[(r * first + pos - 1) * v_pad..][..vocab];
                row_lp.push(log_prob(l, tokens[r][pos] as usize));
            }
        }
        if p.tokens_to_generate == 0 {
            return Ok(Generated { tokens: prompts.to_vec(), prompt_lens: lens, logprobs });
        }

        let mut rng = ChaCha8Rng::seed_from_u64(p.seed);
        let mut top_p = p.sampling.top_p;
        let mut last = logits; // (B, n, V_pad): the last position predicts `pos`
        let mut n = first;
        let mut pos = first;
        while pos < total {
            let mut generated_any = false;
            for r in 0..b {
                if done[r] {
                    continue;
                }
                let raw = &last[(r * n + n - 1) * v_pad..][..vocab];
                let token = if pos < lens[r] {
                    tokens[r][pos] // still inside the prompt: keep it (Megatron's "started" mask)
                } else {
                    let forbid = p.prevent_newline_after.is_some_and(|c| tokens[r][pos - 1] == c);
                    let s = if forbid && (EOL as usize) < vocab {
                        let mut l = raw.to_vec();
                        l[EOL as usize] = -1e10;
                        sample(&l, &p.sampling, top_p, &mut rng)
                    } else {
                        sample(raw, &p.sampling, top_p, &mut rng)
                    };
                    s as i32
                };
                tokens[r][pos] = token;
                logprobs[r].push(log_prob(raw, token as usize));
                if pos >= lens[r] {
                    generated_any = true;
                    if !on_token(r, token) {
                        bail!("generation aborted by the caller (client disconnected)");
                    }
                    // Each row gets at most tokens_to_generate new tokens (Megatron lets the
                    // shorter prompts of a batch run on to the longest one's end; batching
                    // independent requests must not change what each one gets).
                    if stops(p, token, tokens[r][pos - 1]) || pos + 1 >= lens[r] + p.tokens_to_generate {
                        done[r] = true;
                        end[r] = pos + 1;
                    }
                }
            }
            if generated_any {
                top_p = p.sampling.decayed_top_p(top_p);
            }
            pos += 1;
            if pos == total || done.iter().all(|&d| d) {
                break;
            }
            last = steps.run(&tokens, pos - 1, pos)?;
            n = 1;
        }
        for (r, row) in tokens.iter_mut().enumerate() {
            row.truncate(end[r].min(pos));
            logprobs[r].truncate(row.len().saturating_sub(1));
        }
        Ok(Generated { tokens, prompt_lens: lens, logprobs })
    }
}

/// Whether `token` (after `prev`) ends a row: a stop token or the eol rules (SPEC §8.1).
fn stops(p: &GenerationParams, token: i32, prev: i32) -> bool {
    p.stop_tokens.contains(&token)
        || (p.stop_on_double_eol && (token == DOUBLE_EOL || (token == EOL && prev == EOL)))
        || (p.stop_on_eol && !p.stop_on_double_eol && (token == EOL || token == DOUBLE_EOL))
}

/// Runs the model on positions `[from, to)` of every row: through the kv cache (which must
/// then hold exactly `[0, from)`), or by recomputing `[0, to)` and keeping the last rows.
/// A tensor/pipeline-parallel model (rank 0's shard) runs through a slotted cache, one slot
/// per row, every call broadcast to the other ranks ([`megatron_serving::ranks`]): the same
/// positions and logits as the single-rank cache.
struct Stepper<'m> {
    model: &'m mut GptModel,
    cache: Option<megatron_gpt::KvCache>,
    ranks: Option<(Driver, SlotKvCache)>,
}

impl<'m> Stepper<'m> {
    fn new(model: &'m mut GptModel, batch: usize, capacity: usize, use_cache: bool) -> Result<Stepper<'m>> {
        if let Some(mut driver) = Driver::for_model(model)? {
            if !use_cache {
                bail!("model-parallel generation needs the kv cache; drop --no-kv-cache");
            }
            let cache = model.new_slot_kv_cache(batch, capacity)?;
            driver.send(model, &Plan::Init { slots: batch, capacity })?;
            return Ok(Stepper { model, cache: None, ranks: Some((driver, cache)) });
        }
        let cache = if use_cache { Some(model.new_kv_cache(batch, capacity)?) } else { None };
        Ok(Stepper { model, cache, ranks: None })
    }

    /// Logits `(B, to - from, V_pad)` on the host.
    fn run(&mut self, tokens: &[Vec<i32>], from: usize, to: usize) -> Result<Vec<f32>> {
        let b = tokens.len();
        if let Some((driver, cache)) = &mut self.ranks {
            // Row r is slot r, which holds exactly its positions [0, from).
            let ids: Vec<i32> = tokens.iter().flat_map(|row| row[from..to].iter().copied()).collect();
            let slots: Vec<usize> = (0..b).collect();
            let valid = vec![to - from; b];
            let pick: Vec<usize> = (0..ids.len()).collect();
            let call = SlotCall { tokens: &ids, slots: &slots, valid: &valid, pick: &pick };
            return driver.forward(self.model, &call, cache);
        }
        match &mut self.cache {
            Some(cache) => {
                let ids: Vec<i32> = tokens.iter().flat_map(|row| row[from..to].iter().copied()).collect();
                self.model.forward_cached(&ids, cache)
            }
            None => {
                let ids: Vec<i32> = tokens.iter().flat_map(|row| row[..to].iter().copied()).collect();
                let logits = self.model.logits(&ids, b, to)?;
                let all = self.model.backend().to_host(&logits)?.to_f32_vec();
                let v = all.len() / (b * to).max(1);
                Ok((0..b).flat_map(|r| all[(r * to + from) * v..(r * to + to) * v].to_vec()).collect())
            }
        }
    }
}

//! Model-parallel serving (issue 21 item 3): `megatron serve` at tensor parallel size 2 and at
//! pipeline parallel size 2 (ranks as threads, rank 0 driving the continuous-batching engine)
//! answers 16 greedy prompts with exactly the tokens of the tp = pp = 1 server, and log-probs
//! within 1e-4 (the TP all-reduces sum in another order than the tp = 1 GEMM).
//!
//! 1. A checkpoint pretrained for a few iterations, loaded per rank the way `megatron serve
//!    --nproc 2 --tensor-model-parallel-size 2` loads it ([`megatron::serve::ranks::load_ranks`]).
//! 2. A Llama-style model (RoPE, GQA, SwiGLU, RMSNorm, untied output) at tp2 x pp2 (4 ranks),
//!    built directly (its weights do not depend on the layout).

mod common;

use megatron::generate::{load_model, LoadArgs, LoadedModel};
use megatron::serve::ranks::load_ranks;
use megatron::serve::{start_ranks, ServeOptions};
use megatron_comm_local::LocalCommunicator;
use megatron_core::{Backend, ParallelContext, RankGrid, Registry, Tokenizer};
use megatron_gpt::{GptConfig, GptModel};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

/// 16 prompts of 1..=16 ids (different lengths: the rotary model decodes them in groups).
fn prompts(vocab: usize) -> Vec<String> {
    (0..16)
        .map(|i| (0..=i).map(|j| ((7 * i + 3 * j + 1) % (vocab - 1)).to_string()).collect::<Vec<_>>().join(" "))
        .collect()
}

/// Serves `loaded` (+ `followers`), sends the 16 prompts greedily in one `PUT /api` (16
/// sequences of the engine at once) and returns `(tokens, logprobs)` per prompt.
fn serve_greedy(loaded: LoadedModel, followers: Vec<GptModel>, vocab: usize) -> (Vec<Vec<i64>>, Vec<Vec<f64>>) {
    let opts = ServeOptions { http_threads: 2, log: false, ..Default::default() };
    let ctx = loaded.model.parallel_context();
    let (world, tp, pp) = (ctx.world_size(), ctx.grid.tp, ctx.grid.pp);
    let srv = start_ranks(loaded, followers, "127.0.0.1", 0, opts).unwrap();
    // `/health` reports the rank layout.
    let mut s = TcpStream::connect(srv.addr()).unwrap();
    write!(s, "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    let health: Value = serde_json::from_str(raw.split_once("\r\n\r\n").unwrap().1).unwrap();
    let ranks = if world == 1 { "single" } else { "threads" };
    let want = json!({"world_size": world, "tensor_model_parallel_size": tp, "pipeline_model_parallel_size": pp,
        "ranks": ranks, "communicator": if world == 1 { "single" } else { "local" }, "engine_rank": 0});
    assert_eq!(health["parallel"], want, "{health}");
    let body = json!({"prompts": prompts(vocab), "tokens_to_generate": 8, "top_k": 1, "logprobs": true}).to_string();
    let mut s = TcpStream::connect(srv.addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    write!(s, "PUT /api HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len())
        .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    let v: Value = serde_json::from_str(raw.split_once("\r\n\r\n").unwrap().1).unwrap();
    assert!(raw.starts_with("HTTP/1.1 200"), "{raw}");
    let rows = |k: &str| -> Vec<Value> { v[k].as_array().unwrap_or_else(|| panic!("no `{k}` in {v}")).clone() };
    let tokens =
        rows("tokens").iter().map(|r| r.as_array().unwrap().iter().map(|t| t.as_i64().unwrap()).collect()).collect();
    let lps =
        rows("logprobs").iter().map(|r| r.as_array().unwrap().iter().map(|t| t.as_f64().unwrap()).collect()).collect();
    srv.shutdown();
    (tokens, lps)
}

fn assert_same(what: &str, got: &(Vec<Vec<i64>>, Vec<Vec<f64>>), want: &(Vec<Vec<i64>>, Vec<Vec<f64>>)) {
    assert_eq!(got.0.len(), 16);
    for (i, (g, w)) in got.0.iter().zip(&want.0).enumerate() {
        assert_eq!(g, w, "{what}: greedy tokens of prompt {i} differ from tp = pp = 1");
    }
    let worst = got.1.iter().flatten().zip(want.1.iter().flatten()).fold(0f64, |m, (a, b)| m.max((a - b).abs()));
    assert!(worst < 1e-4, "{what}: log-probs differ from tp = pp = 1 by {worst}");
    eprintln!("{what}: 16 prompts x 8 greedy tokens identical to tp = pp = 1; log-probs max |diff| {worst:.2e}");
}

#[test]
fn checkpoint_served_at_tp2_and_pp2_matches_tp1() {
    let dir = tempfile::tempdir().unwrap();
    let save = dir.path().join("ckpt");
    let flags = common::tiny_with(&format!(
        "--train-iters 4 --lr-warmup-iters 1 --seq-length 32 --max-position-embeddings 32 --init-method-std 0.2 --save {} \
         --save-interval 4 --log-interval 10 --eval-interval 100",
        save.display()
    ));
    common::pretrain(&flags).unwrap();
    let registry = Registry::builtin().unwrap();
    let load = LoadArgs { load: save, backend: "cpu".into(), threads: Some(1), ..Default::default() };
    let want = serve_greedy(load_model(&registry, &load).unwrap(), Vec::new(), 100);
    assert!(want.0.iter().all(|r| r.len() > 8), "every row is prompt + 8 generated tokens");
    let (tp0, tp1) = load_ranks(&registry, &load, 2, 2, 1).unwrap();
    assert_same("checkpoint at tp2", &serve_greedy(tp0, tp1, 100), &want);
    let (pp0, pp1) = load_ranks(&registry, &load, 2, 1, 2).unwrap();
    assert_same("checkpoint at pp2", &serve_greedy(pp0, pp1, 100), &want);
    let e = load_ranks(&registry, &load, 4, 2, 1).err().unwrap().to_string();
    assert!(e.contains("--nproc 4 must equal"), "{e}");
}

fn llama(vocab: usize) -> GptConfig {
    let mut c = GptConfig::new(2, 32, 4, 32, vocab);
    c.hidden_dropout = 0.0;
    c.attention_dropout = 0.0;
    c.init_method_std = 0.2;
    c.make_vocab_size_divisible_by = 16;
    c.num_query_groups = Some(2);
    c.position_embedding_type = "rope".into();
    c.normalization = megatron_transformer::NormKind::RMSNorm;
    c.swiglu = true;
    c.ffn_hidden_size = Some(48);
    c.add_bias_linear = false;
    c.untie_embeddings_and_output_weights = true;
    c.seed = 5;
    c
}

fn loaded(model: GptModel, vocab: usize) -> LoadedModel {
    let tokenizer: Arc<dyn Tokenizer> = Arc::new(megatron_tokenizers::NullTokenizer::new(vocab - 1).unwrap());
    LoadedModel { model, tokenizer, vocab_size: vocab, eod: vocab as i32 - 1, args: Value::Null, iteration: 0 }
}

#[test]
fn llama_style_model_served_at_tp2_pp2_matches_tp1() {
    let vocab = 64;
    let backend = || -> Arc<dyn Backend> { Arc::new(megatron_cpu::CpuBackend::with_threads(1).unwrap()) };
    let single = GptModel::new(llama(vocab), backend(), ParallelContext::single()).unwrap();
    let want = serve_greedy(loaded(single, vocab), Vec::new(), vocab);
    let grid = RankGrid::new(4, 2, 1, 2).unwrap();
    let comms = LocalCommunicator::world(4, Duration::from_secs(60));
    let mut ranks: Vec<GptModel> = comms
        .iter()
        .enumerate()
        .map(|(r, comm)| GptModel::new(llama(vocab), backend(), grid.context(r, comm.clone())).unwrap())
        .collect();
    let rank0 = ranks.remove(0);
    assert_same("llama-style at tp2 x pp2", &serve_greedy(loaded(rank0, vocab), ranks, vocab), &want);
}

/// A follower that fails outside any collective (its shard has a smaller vocabulary, so it
/// refuses the driver's token ids) aborts the world: the driver, waiting for the logits of
/// that last stage, gets the follower's error at once instead of the communicator's 60 s
/// timeout, the request is answered with it, and the server shuts down.
#[test]
fn a_failing_follower_fails_the_request_instead_of_hanging() {
    let vocab = 64;
    let backend = || -> Arc<dyn Backend> { Arc::new(megatron_cpu::CpuBackend::with_threads(1).unwrap()) };
    let grid = RankGrid::new(2, 1, 1, 2).unwrap();
    let comms = LocalCommunicator::world(2, Duration::from_secs(60));
    let rank0 = GptModel::new(llama(vocab), backend(), grid.context(0, comms[0].clone())).unwrap();
    let wrong = llama(32);
    let rank1 = GptModel::new(wrong, backend(), grid.context(1, comms[1].clone())).unwrap();
    let opts = ServeOptions { http_threads: 2, log: false, ..Default::default() };
    let srv = start_ranks(loaded(rank0, vocab), vec![rank1], "127.0.0.1", 0, opts).unwrap();
    let t0 = std::time::Instant::now();
    let body = json!({"prompts": ["40 41 42"], "tokens_to_generate": 4, "top_k": 1}).to_string();
    let mut s = TcpStream::connect(srv.addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(s, "PUT /api HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len())
        .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    eprintln!("{}", raw.lines().last().unwrap_or_default());
    assert!(!raw.starts_with("HTTP/1.1 200"), "{raw}");
    assert!(raw.contains("serving rank 1 failed") && raw.contains("outside the vocabulary"), "{raw}");
    assert!(t0.elapsed() < Duration::from_secs(20), "answered after {:?}", t0.elapsed());
    srv.shutdown();
}

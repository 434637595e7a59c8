//! `megatron bench comm`: time and bus bandwidth of the collectives of any communicator, in
//! nccl-tests' conventions, for message sizes from `--min-bytes` to `--max-bytes`.
//!
//! Ranks are threads of this process (`--nproc N`, the `local` communicator) or MPI processes
//! (`mpirun -np N megatron bench comm`, the `mpi` communicator), chosen as for `pretrain`
//! (`--distributed-backend`). Each rank runs the ops on its group (consecutive ranks,
//! `--group-size`, default the world; several groups run at once, like the tp groups of a
//! grid). Time per op = the slowest rank's mean over the timed iterations, after a barrier.
//!
//! Sizes (S, bytes of f32): all_reduce reduces S; all_gather gathers S in all (S/n per rank);
//! reduce_scatter reduces S into S/n per rank; all_to_all sends S/n to each member; send_recv
//! passes S to the next member of a ring. algbw = S / time; busbw = algbw x (2(n-1)/n for
//! all_reduce, (n-1)/n for all_gather, reduce_scatter and all_to_all, 1 for send_recv): the
//! bytes each rank's link carries, comparable across group sizes.

use anyhow::{bail, Context, Result};
use clap::Args;
use megatron_core::{Communicator, DeviceTensor, Group, HostBuffer, ReduceOp, Registry};
use serde_json::json;
use std::sync::Arc;
use std::time::Instant;

#[derive(Args, Debug, Clone)]
pub struct CommBenchArgs {
    /// Ranks as threads of this process (the `local` communicator). Under mpirun leave it at 1.
    #[arg(long, default_value_t = 1)]
    pub nproc: usize,
    /// auto (mpi under an MPI launcher, else local), mpi or local: as for `pretrain`.
    #[arg(long, default_value = "auto")]
    pub distributed_backend: String,
    /// Smallest message (bytes; K, M, G suffixes are KiB, MiB, GiB).
    #[arg(long, default_value = "4K")]
    pub min_bytes: String,
    #[arg(long, default_value = "256M")]
    pub max_bytes: String,
    /// Factor between successive sizes.
    #[arg(long, default_value_t = 4)]
    pub step_factor: usize,
    /// Comma-separated: all_reduce, all_gather, reduce_scatter, all_to_all, send_recv.
    #[arg(long, value_delimiter = ',', default_value = "all_reduce,all_gather,reduce_scatter,all_to_all,send_recv")]
    pub ops: Vec<String>,
    /// Timed iterations per size (fewer for large sizes: at most 1 GiB moved per size and op).
    #[arg(long, default_value_t = 20)]
    pub iters: usize,
    #[arg(long, default_value_t = 2)]
    pub warmup: usize,
    /// Ranks per group (consecutive ranks); default: the whole world.
    #[arg(long)]
    pub group_size: Option<usize>,
    #[arg(long, default_value_t = 10)]
    pub distributed_timeout_minutes: u64,
}

const OPS: [&str; 5] = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv"];

/// `4096`, `4K`, `256M`, `1G` (binary units).
pub fn parse_bytes(s: &str) -> Result<usize> {
    let t = s.trim();
    let (num, mult) = match t.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&t[..t.len() - 1], 1usize << 10),
        Some('M') => (&t[..t.len() - 1], 1 << 20),
        Some('G') => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    let n: usize = num.parse().with_context(|| format!("`{s}`: expected a byte count like 4096, 4K, 256M or 1G"))?;
    n.checked_mul(mult).with_context(|| format!("`{s}` is too large"))
}

fn human(bytes: usize) -> String {
    match bytes {
        b if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{} GiB", b >> 30),
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

/// The message sizes to time.
fn sizes(args: &CommBenchArgs) -> Result<Vec<usize>> {
    let (lo, hi) = (parse_bytes(&args.min_bytes)?, parse_bytes(&args.max_bytes)?);
    if lo == 0 || lo > hi || args.step_factor < 2 {
        bail!("bench comm: need 0 < --min-bytes <= --max-bytes and --step-factor >= 2");
    }
    let mut out = vec![];
    let mut s = lo;
    while s <= hi {
        out.push(s);
        s = s.saturating_mul(args.step_factor);
    }
    Ok(out)
}

/// One result row (as rank 0 prints it).
#[derive(Clone, Debug)]
pub struct Row {
    pub op: String,
    pub bytes: usize,
    pub iters: usize,
    pub secs: f64,
    pub busbw_factor: f64,
}

pub fn run(args: &CommBenchArgs, registry: &Registry) -> Result<()> {
    for op in &args.ops {
        if !OPS.contains(&op.as_str()) {
            bail!("bench comm: unknown op `{op}`; expected some of {}", OPS.join(", "));
        }
    }
    let sizes = sizes(args)?;
    let timeout_secs = args.distributed_timeout_minutes.saturating_mul(60);
    match crate::distributed::select_from_env(&args.distributed_backend, args.nproc)? {
        crate::distributed::Backend::Mpi => {
            let comm = registry
                .communicators("mpi", json!({ "timeout_secs": timeout_secs }), 0)
                .context("building the `mpi` communicator")?
                .into_iter()
                .next()
                .context("the `mpi` communicator returned no endpoint")?;
            let result = run_rank(comm.as_ref(), args, &sizes);
            if let Err(e) = &result {
                comm.abort(&format!("rank {} of {} failed: {e:#}", comm.rank(), comm.world_size()));
            }
            result
        }
        crate::distributed::Backend::Local => {
            let n = args.nproc.max(1);
            let comms = if n == 1 {
                registry.communicators("single", json!({}), 1)?
            } else {
                registry.communicators("local", json!({ "timeout_secs": timeout_secs }), n)?
            };
            std::thread::scope(|s| {
                let handles: Vec<_> = comms
                    .iter()
                    .map(|c: &Arc<dyn Communicator>| {
                        let c = c.clone();
                        let sizes = &sizes;
                        s.spawn(move || {
                            let r = run_rank(c.as_ref(), args, sizes);
                            if let Err(e) = &r {
                                c.abort(&format!("rank {} failed: {e:#}", c.rank()));
                            }
                            r
                        })
                    })
                    .collect();
                let mut first_err = None;
                for h in handles {
                    let r = h.join().unwrap_or_else(|_| Err(anyhow::anyhow!("a rank panicked")));
                    if let (Err(e), None) = (r, &first_err) {
                        first_err = Some(e);
                    }
                }
                first_err.map_or(Ok(()), Err)
            })
        }
    }
}

/// One rank: times every op and size; rank 0 prints the table.
fn run_rank(comm: &dyn Communicator, args: &CommBenchArgs, sizes: &[usize]) -> Result<()> {
    let (rank, n) = (comm.rank(), comm.world_size());
    let g = args.group_size.unwrap_or(n);
    if g == 0 || !n.is_multiple_of(g) {
        bail!("bench comm: --group-size {g} must divide the world size {n}");
    }
    let first = rank / g * g;
    let group = Group::new(if g == n { "world" } else { "bench" }, (first..first + g).collect());
    let world = Group::new("world", (0..n).collect());
    if rank == 0 {
        println!("# megatron bench comm: `{}` communicator, {n} ranks, groups of {g}, f32 messages", comm.name());
        println!(
            "# {:<15} {:>10} {:>6} {:>12} {:>12} {:>12}",
            "op", "size", "iters", "time(us)", "algbw(GB/s)", "busbw(GB/s)"
        );
    }
    if g == 1 {
        bail!("bench comm: groups of one rank move no data; run with --nproc N or under mpirun -np N");
    }
    for op in &args.ops {
        for &bytes in sizes {
            let row = time_op(comm, &group, &world, op, bytes, args)?;
            if rank == 0 {
                let alg = row.bytes as f64 / row.secs / 1e9;
                println!(
                    "{:<17} {:>10} {:>6} {:>12.1} {:>12.3} {:>12.3}",
                    row.op,
                    human(row.bytes),
                    row.iters,
                    row.secs * 1e6,
                    alg,
                    alg * row.busbw_factor
                );
            }
        }
    }
    Ok(())
}

fn f32_tensor(elems: usize, shape: &[usize]) -> Result<DeviceTensor> {
    DeviceTensor::from_host_buffer(HostBuffer::F32((0..elems).map(|i| (i % 13) as f32 * 1e-3).collect()), shape)
}

/// Times `op` at `bytes`: warm-up, barrier, timed iterations; the slowest rank's mean.
fn time_op(
    comm: &dyn Communicator,
    group: &Group,
    world: &Group,
    op: &str,
    bytes: usize,
    args: &CommBenchArgs,
) -> Result<Row> {
    let g = group.size();
    let me = group.index_of(comm.rank()).context("not in own group")?;
    // Whole f32 elements, divisible by the group size.
    let elems = (bytes / 4 / g).max(1) * g;
    let bytes = elems * 4;
    let iters = args.iters.min((1usize << 30) / bytes).max(2);
    let warmup = args.warmup.min(iters);
    let share = elems / g;
    let (next, prev) = (group.ranks[(me + 1) % g], group.ranks[(me + g - 1) % g]);
    let mut a = f32_tensor(elems, &[elems])?;
    let mut b = match op {
        "all_gather" => f32_tensor(share, &[share])?,
        "reduce_scatter" => f32_tensor(share, &[share])?,
        _ => f32_tensor(elems, &[elems])?,
    };
    let splits = vec![share; g];
    let mut once = || -> Result<()> {
        match op {
            "all_reduce" => comm.all_reduce(group, &mut a, ReduceOp::Sum),
            // b holds this rank's share; a the gathered whole.
            "all_gather" => comm.all_gather(group, &b, &mut a),
            "reduce_scatter" => comm.reduce_scatter(group, &a, &mut b, ReduceOp::Sum),
            "all_to_all" => comm.all_to_all(group, &a, &splits, &mut b, &splits),
            "send_recv" => {
                comm.send(group, &a, next)?;
                comm.recv(group, &mut b, prev)
            }
            other => bail!("unknown op {other}"),
        }
    };
    for _ in 0..warmup {
        once()?;
    }
    comm.barrier(world)?;
    let t = Instant::now();
    for _ in 0..iters {
        once()?;
    }
    let mut secs = [t.elapsed().as_secs_f64() / iters as f64];
    comm.all_reduce_f64(world, &mut secs, ReduceOp::Max)?;
    let gf = g as f64;
    let busbw_factor = match op {
        "all_reduce" => 2.0 * (gf - 1.0) / gf,
        "send_recv" => 1.0,
        _ => (gf - 1.0) / gf,
    };
    Ok(Row { op: op.to_string(), bytes, iters, secs: secs[0], busbw_factor })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_sizes_parse_and_step() {
        assert_eq!(parse_bytes("4K").unwrap(), 4096);
        assert_eq!(parse_bytes("256m").unwrap(), 256 << 20);
        assert_eq!(parse_bytes("100").unwrap(), 100);
        assert!(parse_bytes("4X").is_err());
        let a = CommBenchArgs {
            nproc: 2,
            distributed_backend: "local".into(),
            min_bytes: "4K".into(),
            max_bytes: "256M".into(),
            step_factor: 4,
            ops: vec![],
            iters: 1,
            warmup: 0,
            group_size: None,
            distributed_timeout_minutes: 1,
        };
        let s = sizes(&a).unwrap();
        assert_eq!((s.len(), s[0], *s.last().unwrap()), (9, 4096, 256 << 20));
        assert_eq!(human(256 << 20), "256 MiB");
    }
}

//! Fault drill for the `mpi` communicator (run under `mpirun`, see scripts/mpi_faults.sh): every
//! rank all-reduces a counter over the world group once per round; rank `SKIP` stops calling
//! collectives after round `AT` (a rank that skipped a collective and then hangs elsewhere). The
//! other ranks must fail within the timeout with the group, the collective, its sequence number
//! and the ranks that never arrived, then end the job with `MPI_Abort` — never hang.
//!
//! Usage: `mpirun -np N skip_collective SKIP AT TIMEOUT_SECS`

use megatron_comm_mpi::MpiCommunicator;
use megatron_core::{Communicator, Group, ReduceOp};
use std::time::{Duration, Instant};

fn arg(i: usize, name: &str) -> u64 {
    let raw = std::env::args().nth(i).unwrap_or_else(|| {
        eprintln!("usage: skip_collective SKIP AT TIMEOUT_SECS (missing {name})");
        std::process::exit(2)
    });
    raw.parse().unwrap_or_else(|_| {
        eprintln!("{name}: expected a non-negative integer, got {raw:?}");
        std::process::exit(2)
    })
}

fn main() {
    let (skip, at, timeout) = (arg(1, "SKIP") as usize, arg(2, "AT"), arg(3, "TIMEOUT_SECS"));
    let comm = match MpiCommunicator::init(Duration::from_secs(timeout)) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("MPI init failed: {e:#}");
            std::process::exit(1)
        }
    };
    let (rank, n) = (comm.rank(), comm.world_size());
    let world = Group::new("world", (0..n).collect());
    let start = Instant::now();
    for round in 0..at + 5 {
        if rank == skip && round == at {
            // Stops taking part: the peers' collective #at can never complete.
            std::thread::sleep(Duration::from_secs(10 * timeout + 60));
            std::process::exit(3);
        }
        let mut v = [1.0f64];
        if let Err(e) = comm.all_reduce_f64(&world, &mut v, ReduceOp::Sum) {
            eprintln!("rank {rank} of {n} failed after {:.1}s: {e:#}", start.elapsed().as_secs_f64());
            comm.abort("a collective failed");
            std::process::exit(1);
        }
        assert_eq!(v[0], n as f64, "all_reduce sum of ones over {n} ranks");
    }
    eprintln!("rank {rank}: no fault was observed (SKIP {skip} >= world size {n}?)");
}

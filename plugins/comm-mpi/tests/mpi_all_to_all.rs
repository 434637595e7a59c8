//! `all_to_all` with variable splits on the `mpi` communicator, on three real MPI processes:
//! the test relaunches its own binary under `mpirun -np 3` (only the `#[ignore]`d child test,
//! marked by an environment variable) and checks that every rank passed. Skips with a message
//! when `mpirun` is absent. About 7 s, most of it the deliberate timeout of check 4.
//!
//! The child checks, in this order (so they also check that sequence numbers stay in step):
//! 1. splits with zeros in both directions on the world group: every received row names its
//!    sender, its destination and its index, so a shifted or reordered row fails;
//! 2. an all_reduce, then an all_to_all on a sub-group that rank 1 is not in, in bf16;
//! 3. splits that disagree (rank 1 sends rank 0 one row fewer, then one row more, than rank 0
//!    expects): an error on rank 0 naming the splits, never a wrong output;
//! 4. a late rank: rank 2 enters the all_to_all 4 s late (timeout 3 s); ranks 0 and 1 fail with
//!    the collective, its sequence number and `ranks [2] never arrived` (the threads
//!    communicator's message), and rank 2 still completes (its peers' messages were sent);
//!    then a barrier of all three ends the test cleanly (ranks 0 and 1 enter it 1.5 s after
//!    their timeout, so rank 2 is there within the timeout either way, even on a loaded machine).
#![cfg(feature = "mpi")]

use megatron_comm_mpi::MpiCommunicator;
use megatron_core::half::bf16;
use megatron_core::{Communicator, DType, DeviceTensor, Group, HostBuffer, ReduceOp};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const CHILD: &str = "MEGATRON_MPI_ALL_TO_ALL_CHILD";

#[test]
fn all_to_all_on_three_mpi_processes() {
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    if Command::new("mpirun").arg("--version").output().is_err() {
        eprintln!("SKIP: mpirun not found (apt-get install openmpi-bin libopenmpi-dev)");
        return;
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut child = Command::new("mpirun")
        .args(["-np", "3"])
        .arg(exe)
        .args(["child_all_to_all", "--exact", "--ignored", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        // Open MPI: more ranks than cores, and root in CI containers (ignored by MPICH).
        .env("OMPI_MCA_rmaps_base_oversubscribe", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start mpirun");
    let start = Instant::now();
    while child.try_wait().expect("wait for mpirun").is_none() {
        if start.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            panic!("mpirun -np 3 did not finish in 120 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().expect("mpirun output");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "mpirun failed ({})\nstdout:\n{stdout}\nstderr:\n{stderr}", out.status);
    for r in 0..3 {
        assert!(
            stdout.contains(&format!("rank {r}: all_to_all checks passed")),
            "rank {r} missing:\n{stdout}\n{stderr}"
        );
    }
}

fn f32_tensor(v: Vec<f32>, shape: &[usize]) -> DeviceTensor {
    DeviceTensor::from_host_buffer(HostBuffer::F32(v), shape).unwrap()
}

/// Row `i` (of `WIDTH` values) that rank `src` sends to member `dst`.
fn row(src: usize, dst: usize, i: usize) -> Vec<f32> {
    (0..WIDTH).map(|c| (1000 * src + 100 * dst + 10 * i + c) as f32).collect()
}
const WIDTH: usize = 3;

/// Rows rank `src` sends to rank `dst` in check 1: zeros on the diagonal of rank 0, and more.
fn split(src: usize, dst: usize) -> usize {
    (src + 2 * dst) % 3
}

/// Check 1/3/4's all_to_all on the world: `send`/`recv` splits, returns the output or the error.
fn exchange(comm: &MpiCommunicator, world: &Group, send: &[usize], recv: &[usize]) -> anyhow::Result<Vec<f32>> {
    let me = comm.rank();
    let input: Vec<f32> = (0..3).flat_map(|j| (0..send[j]).flat_map(move |i| row(me, j, i))).collect();
    let input = f32_tensor(input, &[send.iter().sum(), WIDTH]);
    let rows_out: usize = recv.iter().sum();
    let mut output = f32_tensor(vec![f32::NAN; rows_out * WIDTH], &[rows_out, WIDTH]);
    comm.all_to_all(world, &input, send, &mut output, recv)?;
    Ok(output.host_f32().unwrap().to_vec())
}

#[test]
#[ignore = "runs under mpirun -np 3, started by all_to_all_on_three_mpi_processes"]
fn child_all_to_all() {
    if std::env::var_os(CHILD).is_none() {
        eprintln!("child_all_to_all runs only under mpirun, started by all_to_all_on_three_mpi_processes");
        return;
    }
    let comm = MpiCommunicator::init(Duration::from_secs(3)).expect("MPI init");
    assert_eq!(comm.world_size(), 3, "run under mpirun -np 3");
    let me = comm.rank();
    let world = Group::new("world", vec![0, 1, 2]);
    let send: Vec<usize> = (0..3).map(|j| split(me, j)).collect();
    let recv: Vec<usize> = (0..3).map(|i| split(i, me)).collect();

    // 1. Variable splits with zeros.
    let got = exchange(&comm, &world, &send, &recv).expect("check 1");
    let want: Vec<f32> = (0..3).flat_map(|i| (0..split(i, me)).flat_map(move |k| row(i, me, k))).collect();
    assert_eq!(got, want, "rank {me}: all_to_all output");

    // 2. An all_reduce in between, then a sub-group without rank 1, in bf16.
    let mut v = [me as f64];
    comm.all_reduce_f64(&world, &mut v, ReduceOp::Sum).unwrap();
    assert_eq!(v[0], 3.0);
    if me != 1 {
        let pair = Group::new("ep", vec![0, 2]);
        let idx = usize::from(me == 2);
        // Member 0 keeps 1 row and sends 2 to member 1; member 1 sends 1 row and keeps 1.
        let send = if idx == 0 { [1usize, 2] } else { [1usize, 1] };
        let recv = if idx == 0 { [1usize, 1] } else { [2usize, 1] };
        let vals: Vec<bf16> =
            (0..send.iter().sum::<usize>() * 2).map(|x| bf16::from_f32((10 * me + x) as f32)).collect();
        let input = DeviceTensor::from_host_buffer(HostBuffer::BF16(vals), &[send.iter().sum(), 2]).unwrap();
        let mut output = DeviceTensor::from_host_buffer(
            HostBuffer::zeros(DType::BF16, recv.iter().sum::<usize>() * 2),
            &[recv.iter().sum(), 2],
        )
        .unwrap();
        comm.all_to_all(&pair, &input, &send, &mut output, &recv).expect("check 2");
        let got: Vec<f32> = output.host_buffer().unwrap().to_f32_vec();
        // Member 0 gets its own row 0 then rank 2's row 0; rank 2 gets rank 0's rows 1..3 then its own row 1.
        let want: Vec<f32> = if idx == 0 { vec![0.0, 1.0, 20.0, 21.0] } else { vec![2.0, 3.0, 4.0, 5.0, 22.0, 23.0] };
        assert_eq!(got, want, "rank {me}: bf16 all_to_all on the sub-group");
    }

    // 3. Disagreeing splits: rank 0 expects one row more, then one row fewer, from rank 1.
    for delta in [1isize, -1] {
        let mut recv3 = recv.clone();
        if me == 0 {
            recv3[1] = (recv3[1] as isize + delta) as usize;
        }
        match exchange(&comm, &world, &send, &recv3) {
            Ok(got) => {
                assert_ne!(me, 0, "rank 0 accepted recv splits {recv3:?} that rank 1 does not send");
                let want: Vec<f32> = (0..3).flat_map(|i| (0..split(i, me)).flat_map(move |k| row(i, me, k))).collect();
                assert_eq!(got, want);
            }
            Err(e) => {
                let msg = format!("{e:#}");
                assert_eq!(me, 0, "rank {me} failed: {msg}");
                assert!(msg.contains("recv splits") && msg.contains("send split"), "{msg}");
                println!("rank 0: disagreeing splits ({delta:+} row): {msg}");
            }
        }
    }

    // 4. A late rank: the others name it after the timeout, it still completes.
    if me == 2 {
        std::thread::sleep(Duration::from_secs(4));
    }
    match exchange(&comm, &world, &send, &recv) {
        Ok(got) => {
            assert_eq!(me, 2, "rank {me} did not time out waiting for rank 2");
            let want: Vec<f32> = (0..3).flat_map(|i| (0..split(i, me)).flat_map(move |k| row(i, me, k))).collect();
            assert_eq!(got, want);
        }
        Err(e) => {
            let msg = format!("{e:#}");
            assert_ne!(me, 2, "{msg}");
            assert!(
                msg.starts_with("collective all_to_all(fp32 x 3) #4 on group `world` [0, 1, 2] timed out")
                    && msg.contains("ranks [2] never arrived"),
                "rank {me}: {msg}"
            );
            println!("rank {me}: late rank named: {msg}");
            // Meet rank 2 (due at ~4 s) in the barrier's timeout window, not before it.
            std::thread::sleep(Duration::from_millis(1500));
        }
    }
    comm.barrier(&world).expect("final barrier");
    println!("rank {me}: all_to_all checks passed");
}

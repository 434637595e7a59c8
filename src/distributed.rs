//! `--distributed-backend auto|mpi|local`: where the ranks of a run come from. The CLI is the
//! only place that reads the launcher's environment (ARCHITECTURE.md principle 4).
//!
//! * `local`: every rank is a thread of this process (`--nproc N`, the `local` communicator);
//! * `mpi`: one rank per process, started by `mpirun -np N` or `srun -n N`; the world comes
//!   from `MPI_COMM_WORLD` (the `mpi` communicator, Cargo feature `mpi`);
//! * `auto` (default): `mpi` when an MPI launcher started this process, else `local`.
//!
//! Thread ranks and MPI ranks never mix: `--nproc N > 1` under MPI is an error, and so is a
//! `local` run under a launcher of more than one process (every process would train alone).

use anyhow::{bail, Result};

/// Environment variables a launcher sets for each process it starts, with the world size:
/// Open MPI's mpirun, MPICH/Intel MPI's Hydra (PMI), PMIx launchers (Open MPI 5, `srun
/// --mpi=pmix`) and SLURM's srun (set only inside a job step, not in the batch script).
const LAUNCHER_SIZE_VARS: &[&str] = &["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "SLURM_STEP_NUM_TASKS"];
/// Set by PMIx launchers, which may not export a size variable.
const LAUNCHER_RANK_VARS: &[&str] = &["PMIX_RANK"];

/// The launcher that started this process, as `(variable, world size if known)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Launcher {
    pub var: &'static str,
    pub size: Option<usize>,
}

/// Detects an MPI launcher from `env` (a lookup, `std::env::var` in the CLI).
pub fn detect_launcher(env: impl Fn(&str) -> Option<String>) -> Option<Launcher> {
    for &var in LAUNCHER_SIZE_VARS {
        if let Some(v) = env(var) {
            return Some(Launcher { var, size: v.trim().parse().ok() });
        }
    }
    LAUNCHER_RANK_VARS.iter().find(|v| env(v).is_some()).map(|&var| Launcher { var, size: None })
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Local,
    Mpi,
}

/// Resolves `--distributed-backend` against the launcher and `--nproc`.
pub fn select(backend: &str, nproc: usize, launcher: Option<&Launcher>, mpi_built: bool) -> Result<Backend> {
    let rebuild = "rebuild with `cargo build --release --features mpi` (needs an MPI library: apt-get install \
                   libopenmpi-dev openmpi-bin libclang-dev; see docs/mpi.md)";
    let multi = launcher.is_some_and(|l| l.size.is_none_or(|s| s > 1));
    let chosen = match backend {
        "local" => {
            if let (true, Some(l)) = (multi, launcher) {
                bail!(
                    "--distributed-backend local, but an MPI launcher started this process ({}={}): every process \
                     would train alone. Use --distributed-backend mpi (or auto) for one rank per process, or start \
                     one process with --nproc N for ranks as threads",
                    l.var,
                    l.size.map_or("?".into(), |s| s.to_string())
                );
            }
            Backend::Local
        }
        "mpi" => Backend::Mpi,
        "auto" => match launcher {
            Some(_) if mpi_built => Backend::Mpi,
            Some(l) if multi => bail!(
                "an MPI launcher started this process ({}={}) but this build has no MPI communicator, so every \
                 process would train alone: {rebuild}; or run one process with --nproc N",
                l.var,
                l.size.map_or("?".into(), |s| s.to_string())
            ),
            _ => Backend::Local,
        },
        other => bail!("--distributed-backend {other}: expected auto, mpi or local"),
    };
    if chosen == Backend::Mpi {
        if !mpi_built {
            bail!("--distributed-backend mpi: this build has no MPI communicator; {rebuild}");
        }
        if nproc > 1 {
            bail!(
                "--nproc {nproc} runs ranks as threads of one process, but this run's ranks are MPI processes \
                 (--distributed-backend {backend}): drop --nproc and launch N processes with `mpirun -np N` (or \
                 `srun -n N`), or use --distributed-backend local with --nproc outside mpirun"
            );
        }
    }
    Ok(chosen)
}

/// The backend of this process (reads the launcher's environment).
pub fn select_from_env(backend: &str, nproc: usize) -> Result<Backend> {
    let launcher = detect_launcher(|v| std::env::var(v).ok());
    select(backend, nproc, launcher.as_ref(), cfg!(feature = "mpi"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |k| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
    }

    #[test]
    fn detects_launchers() {
        assert_eq!(detect_launcher(env(&[])), None);
        let ompi = detect_launcher(env(&[("OMPI_COMM_WORLD_SIZE", "4")])).unwrap();
        assert_eq!(ompi, Launcher { var: "OMPI_COMM_WORLD_SIZE", size: Some(4) });
        assert_eq!(detect_launcher(env(&[("PMI_SIZE", "2")])).unwrap().size, Some(2));
        assert_eq!(detect_launcher(env(&[("SLURM_STEP_NUM_TASKS", "8")])).unwrap().var, "SLURM_STEP_NUM_TASKS");
        assert_eq!(detect_launcher(env(&[("PMIX_RANK", "0")])).unwrap().size, None);
        // The batch script of a SLURM job (no job step) is not a launch.
        assert_eq!(detect_launcher(env(&[("SLURM_NTASKS", "8"), ("SLURM_PROCID", "0")])), None);
    }

    #[test]
    fn never_mixes_threads_and_processes() {
        let four = Launcher { var: "OMPI_COMM_WORLD_SIZE", size: Some(4) };
        let one = Launcher { var: "OMPI_COMM_WORLD_SIZE", size: Some(1) };
        assert_eq!(select("auto", 1, None, true).unwrap(), Backend::Local);
        assert_eq!(select("auto", 4, None, false).unwrap(), Backend::Local);
        assert_eq!(select("auto", 1, Some(&four), true).unwrap(), Backend::Mpi);
        assert_eq!(select("auto", 1, Some(&one), false).unwrap(), Backend::Local);
        let e = select("auto", 1, Some(&four), false).unwrap_err().to_string();
        assert!(e.contains("OMPI_COMM_WORLD_SIZE=4") && e.contains("--features mpi"), "{e}");
        let e = select("auto", 2, Some(&four), true).unwrap_err().to_string();
        assert!(e.contains("--nproc 2") && e.contains("mpirun -np N"), "{e}");
        let e = select("local", 1, Some(&four), true).unwrap_err().to_string();
        assert!(e.contains("every process would train alone"), "{e}");
        assert!(select("mpi", 1, None, false).unwrap_err().to_string().contains("--features mpi"));
        assert_eq!(select("mpi", 1, None, true).unwrap(), Backend::Mpi);
    }
}

//! `megatron-comm-mpi`: the `mpi` communicator plugin. One rank per process, launched by
//! `mpirun`/`srun`; the world (rank, size) comes from `MPI_COMM_WORLD`.
//!
//! Properties it shares with the `local` (threads) communicator, so a run gives the same bits
//! and the same diagnostics whichever one carries it:
//! * reductions add in rank order with the same arithmetic (`megatron_comm_local::payload`);
//! * every group has its own sequence numbers (collectives, and sends/receives per peer), so
//!   different threads of one rank may use different groups at once;
//! * nothing hangs silently: collectives are non-blocking point-to-point messages polled with
//!   `MPI_Test`; after the timeout a rank fails with the group, the collective, its sequence
//!   number and the ranks whose messages never arrived; mismatched collectives are an error
//!   naming both sides. `abort` (a rank failed) ends the whole job with `MPI_Abort`.
//!
//! See `world.rs` for why it does not use MPI's own collectives, and docs/mpi.md for use.
//!
//! Everything is behind the crate's `mpi` feature (which the root package's `mpi` feature turns
//! on): as a path dependency of the root package this crate is a workspace member whatever
//! `exclude` says, and `cargo test --workspace` must build on a machine with no MPI library.

#[cfg(feature = "mpi")]
mod collectives;
#[cfg(feature = "mpi")]
mod ffi;
#[cfg(feature = "mpi")]
mod plugin;
#[cfg(feature = "mpi")]
mod world;

#[cfg(feature = "mpi")]
pub use collectives::MpiCommunicator;
#[cfg(feature = "mpi")]
pub use plugin::MpiConfig;

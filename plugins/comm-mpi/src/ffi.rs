//! Thin wrappers over the few MPI calls the communicator makes, through rsmpi's raw bindings
//! (`mpi::ffi`). Every call returns an error naming the MPI call and MPI's own error string;
//! the private communicator uses `MPI_ERRORS_RETURN` so a failed call is reported, not fatal.
//!
//! Callers serialise all calls with one process-wide lock (see `world.rs`), so the library
//! needs only `MPI_THREAD_SERIALIZED`.

use anyhow::{bail, Result};
use mpi::ffi;
use std::os::raw::{c_char, c_int, c_void};

/// A communicator handle (a pointer in OpenMPI, an int in MPICH).
#[derive(Clone, Copy)]
pub struct Comm(pub ffi::MPI_Comm);
// SAFETY: a handle is an opaque value; every use is serialised by the caller's MPI lock.
unsafe impl Send for Comm {}
unsafe impl Sync for Comm {}

/// An outstanding non-blocking request.
pub struct Request(ffi::MPI_Request);
// SAFETY: as for `Comm`.
unsafe impl Send for Request {}

fn check(code: c_int, what: &str) -> Result<()> {
    if code == ffi::MPI_SUCCESS as c_int {
        return Ok(());
    }
    let mut buf = vec![0 as c_char; 512];
    let mut len: c_int = 0;
    // SAFETY: the buffer has MPI_MAX_ERROR_STRING (< 512) bytes of room.
    let text = unsafe {
        if ffi::MPI_Error_string(code, buf.as_mut_ptr(), &mut len) == ffi::MPI_SUCCESS as c_int {
            let bytes: Vec<u8> = buf[..len.clamp(0, 511) as usize].iter().map(|&c| c as u8).collect();
            String::from_utf8_lossy(&bytes).into_owned()
        } else {
            format!("error code {code}")
        }
    };
    bail!("{what} failed: {text}")
}

/// Whether `MPI_Init` ran in this process already (and `MPI_Finalize` did not).
pub fn initialized() -> bool {
    let (mut init, mut fin) = (0, 0);
    // SAFETY: both may be called at any time, even before MPI_Init.
    unsafe {
        ffi::MPI_Initialized(&mut init);
        ffi::MPI_Finalized(&mut fin);
    }
    init != 0 && fin == 0
}

/// `MPI_Init_thread` asking for `MPI_THREAD_MULTIPLE`; returns the level provided.
pub fn init() -> Result<Threading> {
    let mut provided: c_int = 0;
    // SAFETY: argc/argv may be null (MPI-2); called once per process (checked by the caller).
    let code = unsafe {
        ffi::MPI_Init_thread(std::ptr::null_mut(), std::ptr::null_mut(), ffi::RSMPI_THREAD_MULTIPLE, &mut provided)
    };
    check(code, "MPI_Init_thread")?;
    // SAFETY: reading the library's constants.
    let level = unsafe {
        if provided >= ffi::RSMPI_THREAD_MULTIPLE {
            Threading::Multiple
        } else if provided >= ffi::RSMPI_THREAD_SERIALIZED {
            Threading::Serialized
        } else {
            Threading::Less
        }
    };
    Ok(level)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Threading {
    Less,
    Serialized,
    Multiple,
}

pub fn finalize() -> Result<()> {
    // SAFETY: called once, after every request completed or was abandoned.
    check(unsafe { ffi::MPI_Finalize() }, "MPI_Finalize")
}

/// Ends every process of the job (`mpirun` reports the exit code).
pub fn abort(code: c_int) {
    // SAFETY: MPI_Abort may be called at any time after MPI_Init.
    unsafe {
        ffi::MPI_Abort(ffi::RSMPI_COMM_WORLD, code);
    }
}

/// A private duplicate of `MPI_COMM_WORLD` (our tags cannot meet anybody else's) whose
/// errors are returned instead of aborting.
pub fn dup_world() -> Result<Comm> {
    // SAFETY: MPI is initialised (caller); `out` receives a fresh handle.
    unsafe {
        let mut out = ffi::RSMPI_COMM_NULL;
        check(ffi::MPI_Comm_dup(ffi::RSMPI_COMM_WORLD, &mut out), "MPI_Comm_dup")?;
        check(ffi::MPI_Comm_set_errhandler(out, ffi::RSMPI_ERRORS_RETURN), "MPI_Comm_set_errhandler")?;
        Ok(Comm(out))
    }
}

pub fn free_comm(mut c: Comm) -> Result<()> {
    // SAFETY: `c` came from `dup_world` and has no outstanding requests.
    check(unsafe { ffi::MPI_Comm_free(&mut c.0) }, "MPI_Comm_free")
}

pub fn rank_and_size(c: Comm) -> Result<(usize, usize)> {
    let (mut r, mut s) = (0, 0);
    // SAFETY: valid communicator.
    unsafe {
        check(ffi::MPI_Comm_rank(c.0, &mut r), "MPI_Comm_rank")?;
        check(ffi::MPI_Comm_size(c.0, &mut s), "MPI_Comm_size")?;
    }
    Ok((r as usize, s as usize))
}

/// The largest tag value (`MPI_TAG_UB`, at least 32767 by the standard).
pub fn tag_ub(c: Comm) -> i32 {
    let mut value: *mut c_int = std::ptr::null_mut();
    let mut flag: c_int = 0;
    // SAFETY: for MPI_TAG_UB the attribute value is a pointer to an int owned by MPI.
    unsafe {
        let code = ffi::MPI_Comm_get_attr(
            c.0,
            ffi::MPI_TAG_UB as c_int,
            &mut value as *mut *mut c_int as *mut c_void,
            &mut flag,
        );
        if code != ffi::MPI_SUCCESS as c_int || flag == 0 || value.is_null() {
            return 32767;
        }
        (*value).max(32767)
    }
}

/// The MPI library's version string (first line).
pub fn library_version() -> String {
    let mut buf = vec![0 as c_char; 8192];
    let mut len: c_int = 0;
    // SAFETY: MPI_MAX_LIBRARY_VERSION_STRING is below 8192 in OpenMPI and MPICH.
    unsafe {
        if ffi::MPI_Get_library_version(buf.as_mut_ptr(), &mut len) != ffi::MPI_SUCCESS as c_int {
            return "unknown MPI library".into();
        }
    }
    // Open MPI counts the terminating NUL in `len`: stop at the first NUL (a NUL in the
    // printed line makes tools such as grep treat a job's log as binary).
    let bytes: Vec<u8> = buf[..len.clamp(0, 8191) as usize].iter().map(|&c| c as u8).take_while(|&b| b != 0).collect();
    // MPICH separates its fields with tabs: one space each.
    String::from_utf8_lossy(&bytes).lines().next().unwrap_or("").split_whitespace().collect::<Vec<_>>().join(" ")
}

fn count(bytes: usize, what: &str) -> Result<c_int> {
    c_int::try_from(bytes).map_err(|_| {
        anyhow::anyhow!(
            "{what}: a message of {bytes} bytes is larger than MPI's int count allows; use smaller buckets \
             (--ddp-bucket-size)"
        )
    })
}

/// Starts sending `buf`.
///
/// # Safety
/// `buf` must stay alive and unmoved (its heap block) until the request completed.
pub unsafe fn isend(c: Comm, buf: &[u8], dst: usize, tag: i32) -> Result<Request> {
    let n = count(buf.len(), "MPI_Isend")?;
    let mut req = ffi::RSMPI_REQUEST_NULL;
    let code = ffi::MPI_Isend(buf.as_ptr() as *const c_void, n, ffi::RSMPI_UINT8_T, dst as c_int, tag, c.0, &mut req);
    check(code, "MPI_Isend")?;
    Ok(Request(req))
}

/// Starts receiving into `buf`.
///
/// # Safety
/// `buf` must stay alive and unmoved until the request completed.
pub unsafe fn irecv(c: Comm, buf: &mut [u8], src: usize, tag: i32) -> Result<Request> {
    let n = count(buf.len(), "MPI_Irecv")?;
    let mut req = ffi::RSMPI_REQUEST_NULL;
    let code = ffi::MPI_Irecv(buf.as_mut_ptr() as *mut c_void, n, ffi::RSMPI_UINT8_T, src as c_int, tag, c.0, &mut req);
    check(code, "MPI_Irecv")?;
    Ok(Request(req))
}

/// Whether the request completed (then it is released).
pub fn test(req: &mut Request) -> Result<bool> {
    let mut flag: c_int = 0;
    // SAFETY: `req` is a live request (a completed one is MPI_REQUEST_NULL, also valid).
    let code = unsafe { ffi::MPI_Test(&mut req.0, &mut flag, ffi::RSMPI_STATUS_IGNORE) };
    check(code, "MPI_Test")?;
    Ok(flag != 0)
}

//! The engine under [`crate::MpiCommunicator`]: framed messages, per-group tag spaces and
//! sequence numbers, and a polled exchange of non-blocking sends and receives that gives up
//! after the timeout naming the ranks whose messages never came.
//!
//! Why point-to-point and not MPI's collectives: MPI's blocking collectives never time out,
//! and its non-blocking ones (`MPI_Iallreduce`) can be polled but cannot say *which* rank is
//! missing, nor guarantee the order of a reduction. Here every collective is a set of
//! `MPI_Isend`/`MPI_Irecv` between the group's members, polled with `MPI_Test`: a timeout
//! names exactly the peers whose message did not arrive, and the receiver reduces the pieces
//! in rank order with the `local` communicator's arithmetic (bit-identical results).
//!
//! Groups: the trait hands a group (name + ranks) with every call and never announces them, so
//! there is no collective moment to `MPI_Comm_split`. Instead each group gets its own tag space
//! on one private duplicate of `MPI_COMM_WORLD` (tag = hash of the group, one bit for
//! point-to-point), and every message carries a header with the full 64-bit group hash, the
//! sequence number and the operation: a mismatch (or a tag collision) is an error naming both
//! sides, never a wrong result. MPI's non-overtaking rule (same source, tag and communicator
//! match in order) keeps the messages of one group in sequence.

use crate::ffi::{self, Comm, Request};
use anyhow::{anyhow, bail, Result};
use megatron_core::Group;
use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// First header word of every message.
const MAGIC: u64 = 0x6d65_6761_7472_6e31; // "megatrn1"
/// Fixed header words before the shape: magic, group hash, seq, kind, op, dtype, len, root,
/// payload bytes, ndim.
pub const FIXED_WORDS: usize = 10;

/// What a message says about itself (checked by the receiver against what it expected).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    pub group: u64,
    pub seq: u64,
    /// Collective kind code (see `collectives.rs`), or `P2P_KIND`.
    pub kind: u64,
    pub op: u64,
    pub dtype: u64,
    /// Elements each rank contributes (collectives) or the tensor's element count (p2p).
    pub len: u64,
    pub root: u64,
    pub payload_bytes: u64,
    pub shape: Vec<u64>,
}

impl Header {
    pub fn words(&self) -> usize {
        FIXED_WORDS + self.shape.len()
    }

    /// The message: header words then the payload bytes.
    pub fn frame(&self, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.words() * 8 + payload.len());
        let fixed = [
            MAGIC,
            self.group,
            self.seq,
            self.kind,
            self.op,
            self.dtype,
            self.len,
            self.root,
            payload.len() as u64,
            self.shape.len() as u64,
        ];
        for w in fixed.iter().chain(&self.shape) {
            out.extend_from_slice(&w.to_le_bytes());
        }
        out.extend_from_slice(payload);
        out
    }

    /// Splits a received message into its header and payload.
    pub fn parse(msg: &[u8]) -> Result<(Header, &[u8])> {
        let word = |i: usize| -> Result<u64> {
            let b =
                msg.get(i * 8..i * 8 + 8).ok_or_else(|| anyhow!("a message of {} bytes has no header", msg.len()))?;
            Ok(u64::from_le_bytes(b.try_into().expect("8 bytes")))
        };
        if word(0)? != MAGIC {
            bail!("a message without the megatron header arrived on the private communicator");
        }
        let ndim = word(9)? as usize;
        let shape = (0..ndim).map(|i| word(FIXED_WORDS + i)).collect::<Result<Vec<_>>>()?;
        let h = Header {
            group: word(1)?,
            seq: word(2)?,
            kind: word(3)?,
            op: word(4)?,
            dtype: word(5)?,
            len: word(6)?,
            root: word(7)?,
            payload_bytes: word(8)?,
            shape,
        };
        let start = h.words() * 8;
        let payload = msg
            .get(start..start + h.payload_bytes as usize)
            .ok_or_else(|| anyhow!("a message of {} bytes is shorter than its header says", msg.len()))?;
        Ok((h, payload))
    }
}

/// FNV-1a over the group's name and ranks: the same in every process, whatever the Rust
/// version (std's hasher is not guaranteed stable).
pub fn group_hash(g: &Group) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |b: u8| {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    };
    g.name.bytes().for_each(&mut eat);
    eat(0xff);
    for r in &g.ranks {
        (*r as u64).to_le_bytes().into_iter().for_each(&mut eat);
    }
    h
}

pub fn group_label(g: &Group) -> String {
    format!("`{}` {:?}", g.name, g.ranks)
}

/// The error of an exchange that gave up waiting: its text is the caller's message (the same
/// as the threads communicator's); the type lets a caller add context to every other error
/// while leaving this message first.
#[derive(Debug)]
pub struct TimedOut(pub String);

impl std::fmt::Display for TimedOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TimedOut {}

/// Which sequence counter a call advances.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Stream {
    Collective,
    SendTo(usize),
    RecvFrom(usize),
}

/// One process's MPI state: the private communicator, the lock serialising MPI calls, the
/// sequence counters and the buffered point-to-point sends still in flight.
pub struct Engine {
    pub comm: Comm,
    pub rank: usize,
    pub size: usize,
    pub timeout: Duration,
    tag_ub: i32,
    mpi: Mutex<()>,
    seqs: Mutex<HashMap<(u64, Stream), u64>>,
    /// Buffered sends: the request and the buffer it reads (kept alive until completion).
    in_flight: Mutex<Vec<(Request, Vec<u8>)>>,
}

/// One posted receive or send of an exchange.
struct Post {
    peer: usize,
    recv: bool,
    req: Request,
    buf: Vec<u8>,
    done: bool,
}

impl Engine {
    pub fn new(comm: Comm, rank: usize, size: usize, timeout: Duration) -> Engine {
        Engine {
            comm,
            rank,
            size,
            timeout,
            tag_ub: ffi::tag_ub(comm),
            mpi: Mutex::new(()),
            seqs: Mutex::new(HashMap::new()),
            in_flight: Mutex::new(Vec::new()),
        }
    }

    pub fn lock(&self) -> MutexGuard<'_, ()> {
        self.mpi.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The next sequence number of `stream` on group `hash`.
    pub fn next_seq(&self, hash: u64, stream: Stream) -> u64 {
        let mut seqs = self.seqs.lock().unwrap_or_else(|e| e.into_inner());
        let s = seqs.entry((hash, stream)).or_insert(0);
        *s += 1;
        *s - 1
    }

    /// The group's tag: its hash folded into `[0, tag_ub]`, low bit 1 for point-to-point.
    pub fn tag(&self, hash: u64, p2p: bool) -> i32 {
        let half = (self.tag_ub as u64).div_ceil(2).max(1);
        (((hash % half) << 1) | p2p as u64) as i32
    }

    /// Checks that this rank may use `group` and returns its index in it.
    pub fn member(&self, group: &Group) -> Result<usize> {
        if group.ranks.is_empty() || group.ranks.windows(2).any(|w| w[0] >= w[1]) {
            bail!("group {} must list distinct ranks in ascending order", group_label(group));
        }
        if let Some(&r) = group.ranks.iter().find(|&&r| r >= self.size) {
            bail!("group {} names rank {r}, but the MPI world has {} ranks", group_label(group), self.size);
        }
        group
            .index_of(self.rank)
            .ok_or_else(|| anyhow!("rank {} is not a member of group {}", self.rank, group_label(group)))
    }

    /// Posts `recvs` (peer, bytes) and `sends` (peer, message), then polls until all are done.
    /// Returns the received messages in the order of `recvs`. After the timeout it fails with
    /// `on_timeout(missing peers)`; the buffers of unfinished requests are leaked on purpose
    /// (MPI may still write them) since the job is about to end.
    pub fn exchange(
        &self,
        tag: i32,
        recvs: &[(usize, usize)],
        sends: Vec<(usize, Vec<u8>)>,
        on_timeout: impl Fn(&[usize]) -> String,
    ) -> Result<Vec<Vec<u8>>> {
        let mut posts: Vec<Post> = Vec::with_capacity(recvs.len() + sends.len());
        {
            let _g = self.lock();
            for &(peer, bytes) in recvs {
                let mut buf = vec![0u8; bytes];
                // SAFETY: `buf`'s heap block lives in `posts` until the request completes (or
                // is leaked on failure).
                let req = unsafe { ffi::irecv(self.comm, &mut buf, peer, tag)? };
                posts.push(Post { peer, recv: true, req, buf, done: false });
            }
            for (peer, buf) in sends {
                // SAFETY: as above.
                let req = unsafe { ffi::isend(self.comm, &buf, peer, tag)? };
                posts.push(Post { peer, recv: false, req, buf, done: false });
            }
        }
        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            let mut pending = 0;
            {
                let _g = self.lock();
                for p in posts.iter_mut().filter(|p| !p.done) {
                    match ffi::test(&mut p.req) {
                        Ok(true) => p.done = true,
                        Ok(false) => pending += 1,
                        Err(e) => {
                            let what = if p.recv { "receiving from" } else { "sending to" };
                            let err = anyhow!("{e:#} ({what} rank {})", p.peer);
                            std::mem::forget(posts);
                            return Err(err);
                        }
                    }
                }
            }
            if pending == 0 {
                break;
            }
            if start.elapsed() >= self.timeout {
                let mut missing: Vec<usize> = posts.iter().filter(|p| !p.done).map(|p| p.peer).collect();
                missing.sort_unstable();
                missing.dedup();
                std::mem::forget(posts);
                return Err(TimedOut(on_timeout(&missing)).into());
            }
            backoff(&mut spins);
        }
        self.reap_sends();
        Ok(posts.into_iter().filter(|p| p.recv).map(|p| p.buf).collect())
    }

    /// Starts a buffered send and returns at once (the trait's `send` never waits for the
    /// matching `recv`); the buffer is kept until MPI is done with it.
    pub fn send_buffered(&self, tag: i32, peer: usize, msg: Vec<u8>) -> Result<()> {
        let req = {
            let _g = self.lock();
            // SAFETY: `msg` moves into `in_flight` below; its heap block does not move.
            unsafe { ffi::isend(self.comm, &msg, peer, tag)? }
        };
        self.in_flight.lock().unwrap_or_else(|e| e.into_inner()).push((req, msg));
        self.reap_sends();
        Ok(())
    }

    /// Releases the buffered sends that completed.
    pub fn reap_sends(&self) {
        let mut fl = self.in_flight.lock().unwrap_or_else(|e| e.into_inner());
        if fl.is_empty() {
            return;
        }
        let _g = self.lock();
        fl.retain_mut(|(req, _)| !matches!(ffi::test(req), Ok(true)));
    }

    /// Waits (up to the timeout) for the buffered sends before the communicator is freed.
    pub fn drain_sends(&self) -> bool {
        let start = Instant::now();
        let mut spins = 0;
        loop {
            self.reap_sends();
            if self.in_flight.lock().unwrap_or_else(|e| e.into_inner()).is_empty() {
                return true;
            }
            if start.elapsed() >= self.timeout.min(Duration::from_secs(30)) {
                // Never received: leak the buffers, MPI may still read them.
                std::mem::forget(std::mem::take(&mut *self.in_flight.lock().unwrap_or_else(|e| e.into_inner())));
                return false;
            }
            backoff(&mut spins);
        }
    }
}

/// Polling pace: spin (yielding) for the first few hundred polls, so small messages see
/// microsecond latency, then sleep briefly so a waiting rank leaves the cores to compute.
fn backoff(spins: &mut u32) {
    *spins = spins.saturating_add(1);
    if *spins < 200 {
        std::thread::yield_now();
    } else if *spins < 2000 {
        std::thread::sleep(Duration::from_micros(20));
    } else {
        std::thread::sleep(Duration::from_micros(200));
    }
}

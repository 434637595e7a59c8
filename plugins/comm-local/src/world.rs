//! The shared state of one world of thread ranks: pending collectives keyed by
//! `(group, sequence number)`, point-to-point mailboxes, and the poison message that fails
//! every rank once something went wrong (timeout, mismatch, abort).
//!
//! One mutex guards everything and one condition variable is notified on every change; the
//! arithmetic of a collective runs outside the lock (by the last rank to arrive), so a large
//! data-parallel reduce does not stall collectives of other groups.

use crate::payload::{compute, OpDesc, Outputs, Payload};
use anyhow::{anyhow, bail, Result};
use megatron_core::Group;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Where a pending collective is.
enum Phase {
    /// Waiting for members; `inputs[i]` is member `i`'s contribution once it arrived.
    Gathering(Vec<Option<Payload>>),
    /// Everybody arrived; the last one is computing the result outside the lock.
    Computing,
    Done(Arc<Outputs>),
}

struct Pending {
    desc: OpDesc,
    /// Global rank of the first member to arrive (named in mismatch errors).
    first: usize,
    phase: Phase,
    taken: usize,
}

/// A message in flight from `src` to `dst` on a group.
struct Message {
    seq: u64,
    shape: Vec<usize>,
    payload: Payload,
}

#[derive(Default)]
struct State {
    poison: Option<String>,
    /// Next collective sequence number of `(group, rank)`.
    seqs: HashMap<(Group, usize), u64>,
    pending: HashMap<(Group, u64), Pending>,
    /// Next send / recv number of `(group, src, dst)`.
    sends: HashMap<(Group, usize, usize), u64>,
    recvs: HashMap<(Group, usize, usize), u64>,
    mailboxes: HashMap<(Group, usize, usize), VecDeque<Message>>,
}

/// The state every endpoint of one world shares.
pub struct World {
    pub size: usize,
    pub timeout: Duration,
    state: Mutex<State>,
    changed: Condvar,
}

fn group_label(g: &Group) -> String {
    format!("`{}` {:?}", g.name, g.ranks)
}

impl World {
    pub fn new(size: usize, timeout: Duration) -> World {
        World { size, timeout, state: Mutex::new(State::default()), changed: Condvar::new() }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // No code panics while holding the lock; recover the data if a test thread did.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Fails every waiting and future call with `message`; the first poison wins.
    pub fn poison(&self, message: String) {
        let mut st = self.lock();
        st.poison.get_or_insert(message);
        self.changed.notify_all();
    }

    fn poisoned(st: &State, rank: usize, doing: &str) -> Option<anyhow::Error> {
        st.poison.as_ref().map(|p| anyhow!("{p} [rank {rank} was in {doing}]"))
    }

    /// Checks that `rank` may use `group` and returns its index in it.
    fn member(&self, group: &Group, rank: usize) -> Result<usize> {
        if group.ranks.is_empty() || group.ranks.windows(2).any(|w| w[0] >= w[1]) {
            bail!("group {} must list distinct ranks in ascending order", group_label(group));
        }
        if let Some(&r) = group.ranks.iter().find(|&&r| r >= self.size) {
            bail!("group {} names rank {r}, but the world has {} ranks", group_label(group), self.size);
        }
        group.index_of(rank).ok_or_else(|| anyhow!("rank {rank} is not a member of group {}", group_label(group)))
    }

    /// Runs one collective for `rank`: contributes `input`, waits for the group, returns this
    /// rank's output. `root` (a global rank) picks the broadcast source.
    pub fn collective(
        &self,
        group: &Group,
        rank: usize,
        desc: OpDesc,
        input: Payload,
        root: Option<usize>,
    ) -> Result<Payload> {
        let idx = self.member(group, rank)?;
        let root_index = match root {
            Some(r) => Some(
                group
                    .index_of(r)
                    .ok_or_else(|| anyhow!("{desc}: root rank {r} is not a member of group {}", group_label(group)))?,
            ),
            None => None,
        };
        let n = group.size();
        let mut st = self.lock();
        let seq = {
            let s = st.seqs.entry((group.clone(), rank)).or_insert(0);
            *s += 1;
            *s - 1
        };
        let doing = format!("{desc} #{seq} on group {}", group_label(group));
        if let Some(e) = Self::poisoned(&st, rank, &doing) {
            return Err(e);
        }
        let key = (group.clone(), seq);
        let entry = st.pending.entry(key.clone()).or_insert_with(|| Pending {
            desc,
            first: rank,
            phase: Phase::Gathering((0..n).map(|_| None).collect()),
            taken: 0,
        });
        if entry.desc != desc {
            let msg = format!(
                "mismatched collectives on group {} at sequence #{seq}: rank {} called {} but rank {rank} called \
                 {desc}; every rank of a group must issue the same collectives in the same order",
                group_label(group),
                entry.first,
                entry.desc
            );
            st.poison.get_or_insert(msg.clone());
            self.changed.notify_all();
            bail!(msg);
        }
        let complete = match &mut entry.phase {
            Phase::Gathering(inputs) => {
                inputs[idx] = Some(input);
                inputs.iter().all(Option::is_some)
            }
            _ => bail!("internal error: {doing} joined a collective that had already completed"),
        };
        if complete {
            let Phase::Gathering(inputs) = std::mem::replace(&mut entry.phase, Phase::Computing) else {
                unreachable!("checked above")
            };
            drop(st);
            let inputs: Vec<Payload> = inputs.into_iter().flatten().collect();
            let outputs = compute(&desc, inputs, root_index);
            st = self.lock();
            match outputs {
                Ok(o) => {
                    if let Some(p) = st.pending.get_mut(&key) {
                        p.phase = Phase::Done(Arc::new(o));
                    }
                }
                Err(e) => {
                    st.poison.get_or_insert(format!("{doing} failed: {e:#}"));
                }
            }
            self.changed.notify_all();
        }
        let deadline = Instant::now() + self.timeout;
        loop {
            if let Some(e) = Self::poisoned(&st, rank, &doing) {
                return Err(e);
            }
            let Some(p) = st.pending.get_mut(&key) else { bail!("internal error: {doing} vanished") };
            match &p.phase {
                Phase::Done(out) => {
                    let out = out.clone();
                    p.taken += 1;
                    if p.taken == n {
                        st.pending.remove(&key);
                    }
                    drop(st);
                    return Ok(match &*out {
                        Outputs::Same(x) => x.clone(),
                        Outputs::PerRank(v) => v[idx].clone(),
                    });
                }
                Phase::Gathering(inputs) => {
                    let now = Instant::now();
                    if now >= deadline {
                        let missing: Vec<usize> =
                            group.ranks.iter().zip(inputs).filter(|(_, x)| x.is_none()).map(|(&r, _)| r).collect();
                        let msg = format!(
                            "collective {desc} #{seq} on group {} timed out after {:?} waiting on rank {rank}: \
                             ranks {missing:?} never arrived (they skipped this collective, are stuck, or failed \
                             earlier)",
                            group_label(group),
                            self.timeout
                        );
                        st.poison.get_or_insert(msg);
                        self.changed.notify_all();
                        continue;
                    }
                    st = self.changed.wait_timeout(st, deadline - now).unwrap_or_else(|e| e.into_inner()).0;
                }
                Phase::Computing => {
                    st = self.changed.wait(st).unwrap_or_else(|e| e.into_inner());
                }
            }
        }
    }

    /// Buffered send: queues `payload` for `dst` and returns at once.
    pub fn send(&self, group: &Group, rank: usize, dst: usize, shape: &[usize], payload: Payload) -> Result<()> {
        self.member(group, rank)?;
        if group.index_of(dst).is_none() || dst == rank {
            bail!(
                "send from rank {rank} to rank {dst}: the destination must be another member of group {}",
                group_label(group)
            );
        }
        let mut st = self.lock();
        let key = (group.clone(), rank, dst);
        let seq = {
            let s = st.sends.entry(key.clone()).or_insert(0);
            *s += 1;
            *s - 1
        };
        if let Some(e) =
            Self::poisoned(&st, rank, &format!("send #{seq} to rank {dst} on group {}", group_label(group)))
        {
            return Err(e);
        }
        st.mailboxes.entry(key).or_default().push_back(Message { seq, shape: shape.to_vec(), payload });
        self.changed.notify_all();
        Ok(())
    }

    /// Waits for the next message from `src`; its shape and dtype must be `shape`/`want`'s.
    pub fn recv(&self, group: &Group, rank: usize, src: usize, shape: &[usize], want: &Payload) -> Result<Payload> {
        self.member(group, rank)?;
        if group.index_of(src).is_none() || src == rank {
            bail!(
                "recv on rank {rank} from rank {src}: the source must be another member of group {}",
                group_label(group)
            );
        }
        let mut st = self.lock();
        let key = (group.clone(), src, rank);
        let seq = {
            let s = st.recvs.entry(key.clone()).or_insert(0);
            *s += 1;
            *s - 1
        };
        let doing = format!("recv #{seq} from rank {src} on group {}", group_label(group));
        let deadline = Instant::now() + self.timeout;
        loop {
            if let Some(e) = Self::poisoned(&st, rank, &doing) {
                return Err(e);
            }
            if let Some(m) = st.mailboxes.get_mut(&key).and_then(VecDeque::pop_front) {
                drop(st);
                let same_type = std::mem::discriminant(&m.payload) == std::mem::discriminant(want)
                    && match (&m.payload, want) {
                        (Payload::Tensor(a), Payload::Tensor(b)) => a.dtype() == b.dtype(),
                        _ => true,
                    };
                if !same_type || m.shape != shape {
                    let msg = format!(
                        "mismatched point-to-point transfer on group {}: rank {src} sent #{} of shape {:?} ({}), \
                         rank {rank} posted recv #{seq} of shape {shape:?} ({})",
                        group_label(group),
                        m.seq,
                        m.shape,
                        describe(&m.payload),
                        describe(want)
                    );
                    self.poison(msg.clone());
                    bail!(msg);
                }
                return Ok(m.payload);
            }
            let now = Instant::now();
            if now >= deadline {
                let msg =
                    format!("{doing} timed out after {:?} on rank {rank}: rank {src} never sent it", self.timeout);
                st.poison.get_or_insert(msg);
                self.changed.notify_all();
                continue;
            }
            st = self.changed.wait_timeout(st, deadline - now).unwrap_or_else(|e| e.into_inner()).0;
        }
    }
}

fn describe(p: &Payload) -> String {
    match p {
        Payload::Tensor(b) => b.dtype().to_string(),
        Payload::F64(_) => "f64".into(),
        Payload::Empty => "empty".into(),
        Payload::Parts(p) => format!("{} parts", p.len()),
    }
}

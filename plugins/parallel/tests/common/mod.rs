//! A pretend communicator endpoint for tests: any rank of any world size, recording every
//! collective. A SUM all-reduce either multiplies by the group size (every rank of the group
//! holds the same tensor) or, for a `lonely` endpoint, leaves the tensor as it is (the other
//! ranks contribute zeros).

#![allow(dead_code)] // each test file uses a different part

use megatron_core::anyhow::{bail, Result};
use megatron_core::{Communicator, DeviceTensor, Group, ReduceOp};
use std::sync::Mutex;

pub struct FakeComm {
    pub rank: usize,
    pub world: usize,
    pub lonely: bool,
    pub calls: Mutex<Vec<(String, Vec<usize>, ReduceOp)>>,
}

impl FakeComm {
    pub fn new(rank: usize, world: usize) -> FakeComm {
        FakeComm { rank, world, lonely: false, calls: Mutex::new(Vec::new()) }
    }

    pub fn lonely(rank: usize, world: usize) -> FakeComm {
        FakeComm { lonely: true, ..FakeComm::new(rank, world) }
    }
}

impl Communicator for FakeComm {
    fn name(&self) -> &str {
        "fake"
    }
    fn world_size(&self) -> usize {
        self.world
    }
    fn rank(&self) -> usize {
        self.rank
    }
    fn all_reduce(&self, group: &Group, t: &mut DeviceTensor, op: ReduceOp) -> Result<()> {
        self.calls.lock().unwrap().push((group.name.clone(), group.ranks.clone(), op));
        if op == ReduceOp::Sum && !self.lonely {
            let n = group.size() as f32;
            t.host_f32_mut()?.iter_mut().for_each(|x| *x *= n);
        }
        Ok(())
    }
    fn all_reduce_f64(&self, _: &Group, _: &mut [f64], _: ReduceOp) -> Result<()> {
        bail!("not used")
    }
    fn all_gather(&self, _: &Group, _: &DeviceTensor, _: &mut DeviceTensor) -> Result<()> {
        bail!("not used")
    }
    fn reduce_scatter(&self, _: &Group, _: &DeviceTensor, _: &mut DeviceTensor, _: ReduceOp) -> Result<()> {
        bail!("not used")
    }
    fn broadcast(&self, _: &Group, _: &mut DeviceTensor, _: usize) -> Result<()> {
        bail!("not used")
    }
    fn send(&self, _: &Group, _: &DeviceTensor, _: usize) -> Result<()> {
        bail!("not used")
    }
    fn recv(&self, _: &Group, _: &mut DeviceTensor, _: usize) -> Result<()> {
        bail!("not used")
    }
    fn barrier(&self, _: &Group) -> Result<()> {
        bail!("not used")
    }
}

//! A [`Backend`] decorator that times every op (synchronising after each) to give the per-op
//! profile of `megatron bench`. It adds one `synchronize` per op, which is free on the CPU.

use megatron_core::{Backend, DeviceTensor, Result};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

mod ops;
mod sequence_ops;

/// Wraps a backend; [`ProfilingBackend::report`] gives `(op, calls, seconds)` sorted by time
/// (GEMMs keyed by `m x n x k` and transposes).
pub struct ProfilingBackend {
    inner: Arc<dyn Backend>,
    times: Mutex<BTreeMap<String, (u64, f64)>>,
}

impl ProfilingBackend {
    pub fn new(inner: Arc<dyn Backend>) -> ProfilingBackend {
        ProfilingBackend { inner, times: Mutex::new(BTreeMap::new()) }
    }

    fn timed<T>(&self, op: impl Into<String>, f: impl FnOnce(&dyn Backend) -> Result<T>) -> Result<T> {
        let t = Instant::now();
        let out = f(self.inner.as_ref())?;
        self.inner.synchronize()?;
        let dt = t.elapsed().as_secs_f64();
        if let Ok(mut m) = self.times.lock() {
            let e = m.entry(op.into()).or_insert((0, 0.0));
            e.0 += 1;
            e.1 += dt;
        }
        Ok(out)
    }

    pub fn reset(&self) {
        if let Ok(mut m) = self.times.lock() {
            m.clear();
        }
    }

    pub fn report(&self) -> Vec<(String, u64, f64)> {
        let m = self.times.lock().map(|m| m.clone()).unwrap_or_default();
        let mut v: Vec<_> = m.into_iter().map(|(k, (n, s))| (k, n, s)).collect();
        v.sort_by(|a, b| b.2.total_cmp(&a.2));
        v
    }
}

type T = DeviceTensor;

/// `a,b->c` dtypes of an op (mixed precision runs the same op in several dtype combinations).
fn dtypes(ins: &[&T], out: &T) -> String {
    let ins: Vec<String> = ins.iter().map(|t| t.dtype().to_string()).collect();
    format!("{}->{}", ins.join(","), out.dtype())
}

//! [`MetricsSink`]: where scalars go (console, JSONL, TensorBoard).

use crate::Result;

pub trait MetricsSink: Send {
    fn name(&self) -> &str;
    /// A scalar `tag` at `step` (iteration); `samples` is the consumed-samples x-axis
    /// (TensorBoard's "`<tag> vs samples`" series).
    fn scalar(&mut self, tag: &str, value: f64, step: u64, samples: u64) -> Result<()>;
    /// Makes everything written so far durable.
    fn flush(&mut self) -> Result<()>;
}

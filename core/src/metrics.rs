//! [`MetricsSink`]: where scalars go (console, JSONL, TensorBoard).

use crate::Result;

pub trait MetricsSink: Send {
    fn name(&self) -> &str;
    /// A scalar `tag` at `step` (iteration); `samples` is the consumed-samples x-axis
    /// (TensorBoard's "`<tag> vs samples`" series).
    fn scalar(&mut self, tag: &str, value: f64, step: u64, samples: u64) -> Result<()>;
    /// A scalar with no "`vs samples`" series (Megatron writes timers such as
    /// `iteration-time` against the iteration only). The default ignores it; sinks that
    /// have a samples axis override it.
    fn scalar_at_step(&mut self, tag: &str, value: f64, step: u64) -> Result<()> {
        let _ = (tag, value, step);
        Ok(())
    }
    /// A text summary (Megatron writes every argument as one: `add_text(name, str(value))`).
    /// The default ignores it.
    fn text(&mut self, tag: &str, text: &str, step: u64) -> Result<()> {
        let _ = (tag, text, step);
        Ok(())
    }
    /// Makes everything written so far durable.
    fn flush(&mut self) -> Result<()>;
}

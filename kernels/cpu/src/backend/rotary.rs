//! `impl RotaryOps for CpuBackend`: rotary embedding, plain and scaled.

use crate::widen::Out;
use crate::{rotary, CpuBackend};
use megatron_core::{DeviceTensor, Result, RotaryOps, RotarySpec};

impl RotaryOps for CpuBackend {
    fn rotary(&self, qkv: &mut DeviceTensor, spec: RotarySpec, inverse: bool) -> Result<()> {
        self.run(|| {
            let mut o = Out::new(qkv, true)?;
            rotary::rotary(o.t(), spec, inverse)?;
            o.finish()
        })
    }
    fn rotary_scaled(
        &self,
        qkv: &mut DeviceTensor,
        spec: RotarySpec,
        scaling: megatron_core::RopeScaling,
        inverse: bool,
    ) -> Result<()> {
        self.run(|| {
            let mut o = Out::new(qkv, true)?;
            rotary::rotary_scaled(o.t(), spec, scaling, inverse)?;
            o.finish()
        })
    }
}

//! `impl KvCacheOps for CpuBackend`: KV-cache and slotted-cache decoding attention.

use crate::widen::{input, Out};
use crate::{kv_attention, kv_slots, CpuBackend};
use megatron_core::{DeviceTensor, KvCacheAttentionSpec, KvCacheOps, Result};

impl KvCacheOps for CpuBackend {
    fn attention_kv_cache(
        &self,
        qkv: &DeviceTensor,
        k_cache: &mut DeviceTensor,
        v_cache: &mut DeviceTensor,
        key_start: Option<&DeviceTensor>,
        out: &mut DeviceTensor,
        spec: KvCacheAttentionSpec,
    ) -> Result<()> {
        self.run(|| {
            let qkv = input(qkv)?;
            let (mut kc, mut vc) = (Out::new(k_cache, true)?, Out::new(v_cache, true)?);
            let mut o = Out::new(out, false)?;
            kv_attention::attention_kv_cache(&qkv, kc.t(), vc.t(), key_start, o.t(), spec)?;
            kc.finish()?;
            vc.finish()?;
            o.finish()
        })
    }
    fn attention_kv_cache_slots(
        &self,
        qkv: &DeviceTensor,
        k_cache: &mut DeviceTensor,
        v_cache: &mut DeviceTensor,
        slots: &[usize],
        offsets: &[usize],
        out: &mut DeviceTensor,
        spec: KvCacheAttentionSpec,
    ) -> Result<()> {
        self.run(|| {
            let qkv = input(qkv)?;
            let (mut kc, mut vc) = (Out::new(k_cache, true)?, Out::new(v_cache, true)?);
            let mut o = Out::new(out, false)?;
            kv_slots::attention_kv_cache_slots(&qkv, kc.t(), vc.t(), slots, offsets, o.t(), spec)?;
            kc.finish()?;
            vc.finish()?;
            o.finish()
        })
    }
}

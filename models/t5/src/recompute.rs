//! Full activation recomputation over one T5 stack (`--recompute-granularity full`, SPEC
//! §6.9): the encoder and the decoder are each treated as one stage of
//! [`megatron_transformer::FullRecompute`] units. A unit's layers keep only the unit's input
//! after their forward; before the backward of the unit's last layer the unit's forward is
//! re-run (same [`StepInfo`], so the same dropout masks: bit-identical activations) and the
//! backward then proceeds as without recomputation.

use crate::attention::AttnInputs;
use crate::layer::T5Layer;
use anyhow::Result;
use megatron_core::{Backend, DeviceTensor};
use megatron_transformer::{FullRecompute, StepInfo};

/// What every layer of one stack attends with.
#[derive(Clone, Copy)]
pub struct StackInputs<'a> {
    /// The encoder output (decoder only).
    pub memory: Option<&'a DeviceTensor>,
    pub self_in: AttnInputs<'a>,
    pub cross_in: Option<AttnInputs<'a>>,
}

fn copy_of(be: &dyn Backend, x: &DeviceTensor) -> Result<DeviceTensor> {
    let mut c = be.zeros(x.shape(), x.dtype())?;
    be.copy(x, &mut c)?;
    Ok(c)
}

/// The stack's output `(N, C)` from `x (N, C)`; in training with `rc`, pushes every unit's
/// input onto `unit_inputs` (in unit order) and frees the unit's activations.
pub fn forward_stack(
    be: &dyn Backend,
    layers: &mut [T5Layer],
    rc: Option<FullRecompute>,
    mut x: DeviceTensor,
    a: StackInputs,
    step: &StepInfo,
    unit_inputs: &mut Vec<DeviceTensor>,
) -> Result<DeviceTensor> {
    let units = match rc {
        Some(r) if step.train => r.units(layers.len()),
        _ => Vec::new(),
    };
    for i in 0..layers.len() {
        if units.iter().any(|u| u.start == i) {
            unit_inputs.push(copy_of(be, &x)?);
        }
        x = layers[i].forward(x, a.memory, a.self_in, a.cross_in, step)?;
        if let Some(u) = units.iter().find(|u| u.end == i + 1) {
            for l in &mut layers[u.clone()] {
                l.drop_saved()?;
            }
        }
    }
    Ok(x)
}

/// `d_x (N, C)` of the stack from `d (N, C)`, re-running each unit's forward from
/// `unit_inputs` (as [`forward_stack`] left them) first; adds into `d_memory` and `d_bias`.
#[allow(clippy::too_many_arguments)]
pub fn backward_stack(
    be: &dyn Backend,
    layers: &mut [T5Layer],
    rc: Option<FullRecompute>,
    mut d: DeviceTensor,
    a: StackInputs,
    mut d_memory: Option<&mut DeviceTensor>,
    mut d_bias: Option<&mut DeviceTensor>,
    step: &StepInfo,
    unit_inputs: &[DeviceTensor],
) -> Result<DeviceTensor> {
    let units = rc.map(|r| r.units(layers.len())).unwrap_or_default();
    for i in (0..layers.len()).rev() {
        if let Some((k, u)) = units.iter().enumerate().find(|(_, u)| u.end == i + 1) {
            let input = unit_inputs.get(k).ok_or_else(|| {
                anyhow::anyhow!("t5 recompute: no saved input of unit {k} (forward without recompute?)")
            })?;
            let mut x = copy_of(be, input)?;
            for l in u.clone() {
                x = layers[l].forward(x, a.memory, a.self_in, a.cross_in, step)?;
            }
        }
        d = layers[i].backward(
            d,
            a.memory,
            a.self_in,
            a.cross_in,
            d_memory.as_deref_mut(),
            d_bias.as_deref_mut(),
            step,
        )?;
    }
    Ok(d)
}

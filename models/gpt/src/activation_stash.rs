//! Keeping the activations of every in-flight training microbatch of a pipeline stage, so a
//! backward never re-runs its forward.
//!
//! The modules hold the saved-for-backward tensors of ONE forward in their buffers: that
//! microbatch is [`GptModel::live`](crate::model::GptModel). When another forward (or the
//! backward of another microbatch) is about to overwrite them while the live microbatch still
//! waits for its backward, its tensors are moved (handle swaps, no copy) into its stash entry
//! and a spare set takes their place. Before a backward, the microbatch's set is swapped back
//! in and the buffers it replaces (consumed by an earlier backward) become the spare set of
//! the next stash. So with one microbatch in flight (pp = 1, the last stage, `forward` /
//! `backward`) nothing moves and nothing is allocated; with `k` in flight the stage holds `k`
//! sets, allocated during the first iteration and reused afterwards.
//!
//! Memory of one set (f32, `N = B·T`, per stage of `n` layers, `L/pp` when even): the residual
//! stream and block output `(n + 2)·(B, T, C)`, about `16·N·C/tp`-ish per layer (see
//! `megatron_transformer::layer`: `ln1_out, h1, ln2_out (B, T, C)`, `qkv (B, T, 3C/tp)`,
//! `context (B, T, C/tp)`, `fc1_out, act_out (B, T, F/tp)`, `lse (B, np/tp, T)`, norm
//! statistics `(N)`), and on the last stage the logits `(B, T, V/tp)` plus the cross-entropy
//! statistics `3·(N)`. GPT-2 124M stage 0 of pp = 2 at B = 1, T = 1024: about 0.3 GB.

use crate::model::GptModel;
use crate::stage::Saved;
use anyhow::{bail, Result};
use megatron_core::DeviceTensor;
use megatron_transformer::SavedActivations;

impl GptModel {
    /// Every buffer a training forward of this stage fills for its backward, in a fixed order.
    fn activation_slots(&mut self) -> Vec<&mut DeviceTensor> {
        let mut v = self.decoder.saved_activations_mut();
        if self.ctx.is_last_stage() {
            v.push(&mut self.logits);
            v.extend(self.cross_entropy.saved_activations_mut());
        }
        v
    }

    /// Before the module buffers are overwritten: moves the live microbatch's activations into
    /// its stash entry if it still waits for its backward, leaving a spare set in the modules.
    pub(crate) fn stash_live(&mut self) -> Result<()> {
        let Some(mb) = self.live.take() else {
            return Ok(());
        };
        if !self.stash.contains_key(&mb) {
            return Ok(()); // its backward ran, or a whole-model call dropped it
        }
        let mut set = match self.spare.pop() {
            Some(set) => set,
            None => {
                let n = self.activation_slots().len();
                SavedActivations::placeholders(self.backend.as_ref(), n)?
            }
        };
        set.swap_with(self.activation_slots())?;
        if let Some(saved) = self.stash.get_mut(&mb) {
            saved.activations = Some(set);
        }
        Ok(())
    }

    /// Makes the module buffers hold microbatch `mb`'s activations (taken out of the stash as
    /// `saved`) for its backward.
    pub(crate) fn restore_activations(&mut self, mb: usize, saved: &mut Saved) -> Result<()> {
        if self.live == Some(mb) {
            return Ok(());
        }
        self.stash_live()?;
        let Some(mut set) = saved.activations.take() else {
            bail!(
                "the activations of microbatch {mb} on pipeline stage {} were lost (a whole-model forward, \
                 `logits` or kv-cache decoding ran while it was in flight); run its forward again",
                self.ctx.pp_rank
            );
        };
        set.swap_with(self.activation_slots())?;
        // What the modules held (consumed by an earlier backward) is reused by the next stash.
        self.spare.push(set);
        self.live = Some(mb);
        Ok(())
    }

    /// Forgets every in-flight microbatch (whole-model calls and decoding reuse the buffers).
    pub(crate) fn discard_in_flight(&mut self) {
        self.stash.clear();
        self.live = None;
    }

    /// Stage forwards run since the model was built (training and eval). Each microbatch's
    /// forward runs once: a test that a backward never recomputes it.
    pub fn forward_count(&self) -> usize {
        self.forwards
    }

    /// Bytes of activations held outside the modules for in-flight microbatches and spares.
    pub fn stashed_activation_bytes(&self) -> usize {
        let stashed = self.stash.values().filter_map(|s| s.activations.as_ref()).map(|a| a.bytes());
        stashed.chain(self.spare.iter().map(|a| a.bytes())).sum()
    }
}

//! SIGINT/SIGTERM handling: the first signal asks the training loop to save a checkpoint and
//! exit after the current iteration; a second one exits at once (as an impatient user expects).

use anyhow::{Context, Result};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// Installs the handlers and returns the flag the training loop polls.
pub fn install() -> Result<Arc<AtomicBool>> {
    let flag = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        // Order matters: the conditional shutdown is checked before the flag is set, so the
        // second signal (flag already true) terminates with exit status 130/143.
        signal_hook::flag::register_conditional_shutdown(sig, 128 + sig, flag.clone())
            .context("installing the signal handler")?;
        signal_hook::flag::register(sig, flag.clone()).context("installing the signal handler")?;
    }
    Ok(flag)
}

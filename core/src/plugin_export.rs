//! The library side of dynamic plugins: the [`export_plugin!`](crate::export_plugin) macro a
//! plugin crate invokes once, and the functions its three `extern "C"` symbols call.
//!
//! A `cdylib` links its own copy of megatron-core, `inventory` and std. So the register symbol
//! walks the *library's* inventory and hands the records over as leaked, `'static` data (the
//! host copies them and never frees anything the library allocated for them), and the
//! catch-unwind symbol runs host closures under the *library's* `catch_unwind`: a panic raised
//! by the library's std can only be caught by that same std (another copy would see a foreign
//! exception and abort).

use crate::registry::{Plugin, PluginCrate};
use std::ffi::c_void;
use std::panic::AssertUnwindSafe;

/// Symbol returning the library's NUL-terminated build tag.
pub const TAG_SYMBOL: &str = "megatron_plugin_build_tag";
/// Symbol returning the library's plugin records (an [`ExportedCrates`] pointer).
pub const REGISTER_SYMBOL: &str = "megatron_plugin_register";
/// Symbol running a closure under the library's `catch_unwind`.
pub const CATCH_SYMBOL: &str = "megatron_plugin_catch_unwind";

/// This build's tag (see core/build.rs): core version, rustc, target, panic strategy, core
/// features and the Cargo.lock hash of megatron-core's dependency closure.
pub const BUILD_TAG: &str = env!("MEGATRON_BUILD_TAG");

/// `extern "C" fn() -> *const c_char` (the build tag).
pub type TagFn = unsafe extern "C" fn() -> *const std::os::raw::c_char;
/// `extern "C" fn() -> *const ExportedCrates` (as `*const c_void`).
pub type RegisterFn = unsafe extern "C" fn() -> *const c_void;
/// Runs `run(data)`; on a panic calls `set_message(message_data, ptr, len)` and returns false.
pub type RunFn = unsafe extern "C-unwind" fn(*mut c_void);
pub type SetMessageFn = unsafe extern "C" fn(*mut c_void, *const u8, usize);
pub type CatchFn = unsafe extern "C" fn(*mut c_void, RunFn, *mut c_void, SetMessageFn) -> bool;

/// One plugin crate of a library, as handed to the host (all `'static`: leaked, never freed).
pub struct ExportedCrate {
    pub crate_name: &'static str,
    pub version: &'static str,
    pub plugins: &'static [Plugin],
}

/// Every plugin crate of a library.
pub struct ExportedCrates {
    pub crates: &'static [ExportedCrate],
}

/// Body of the register symbol: collects this library's own inventory records. Only valid
/// across the boundary when the build tags match (same compiler and dependency versions).
pub fn collect_records() -> *const c_void {
    let crates: Vec<ExportedCrate> = inventory::iter::<PluginCrate>
        .into_iter()
        .map(|k| ExportedCrate {
            crate_name: k.crate_name,
            version: k.version,
            plugins: Box::leak((k.plugins)().into_boxed_slice()),
        })
        .collect();
    let all: &'static ExportedCrates =
        Box::leak(Box::new(ExportedCrates { crates: Box::leak(crates.into_boxed_slice()) }));
    all as *const ExportedCrates as *const c_void
}

/// Body of the catch-unwind symbol.
///
/// # Safety
/// `run` and `set_message` must be valid for `data` and `message_data` (the host's
/// [`crate::plugin_loader::PanicGuard`] guarantees it).
pub unsafe fn catch_unwind_entry(
    data: *mut c_void,
    run: RunFn,
    message_data: *mut c_void,
    set_message: SetMessageFn,
) -> bool {
    // SAFETY: forwarded from the caller's contract.
    match std::panic::catch_unwind(AssertUnwindSafe(|| unsafe { run(data) })) {
        Ok(()) => true,
        Err(payload) => {
            let msg = panic_message(payload.as_ref());
            // SAFETY: the host passes a setter valid for `message_data`; `msg` outlives the call.
            unsafe { set_message(message_data, msg.as_ptr(), msg.len()) };
            false
        }
    }
}

/// The text of a panic payload (`&str` or `String`, else a placeholder).
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic with a non-string payload".to_string()
    }
}

/// Exports this crate's plugins from a `cdylib`: invoke it once, at the crate root, next to
/// the crate's single `inventory::submit!` of a [`PluginCrate`].
///
/// `export_plugin!()` reports this build's [`BUILD_TAG`]; `export_plugin!(build_tag = EXPR)`
/// reports another tag and exists only so tests can forge a mismatching library.
///
/// The three symbols are unmangled, so at most one crate per linked binary may invoke it:
/// gate the invocation behind a (default) Cargo feature that the `megatron` package turns off
/// when it links the crate as an rlib.
#[macro_export]
macro_rules! export_plugin {
    () => {
        $crate::export_plugin!(build_tag = $crate::plugin_export::BUILD_TAG);
    };
    (build_tag = $tag:expr) => {
        /// The build tag the host compares with its own (megatron-rs plugin ABI).
        #[no_mangle]
        pub extern "C" fn megatron_plugin_build_tag() -> *const ::std::os::raw::c_char {
            static TAG: ::std::sync::OnceLock<::std::ffi::CString> = ::std::sync::OnceLock::new();
            TAG.get_or_init(|| {
                let tag = $tag;
                let tag: &str = ::std::convert::AsRef::as_ref(&tag);
                ::std::ffi::CString::new(tag.replace('\0', "")).unwrap_or_default()
            })
            .as_ptr()
        }

        /// The plugin records of this library (megatron-rs plugin ABI).
        #[no_mangle]
        pub extern "C" fn megatron_plugin_register() -> *const ::std::ffi::c_void {
            $crate::plugin_export::collect_records()
        }

        /// Runs a host closure under this library's `catch_unwind` (megatron-rs plugin ABI).
        ///
        /// # Safety
        /// Called by the host's plugin loader only, with matching pointers.
        #[no_mangle]
        pub unsafe extern "C" fn megatron_plugin_catch_unwind(
            data: *mut ::std::ffi::c_void,
            run: $crate::plugin_export::RunFn,
            message_data: *mut ::std::ffi::c_void,
            set_message: $crate::plugin_export::SetMessageFn,
        ) -> bool {
            // SAFETY: forwarded from this function's contract.
            unsafe { $crate::plugin_export::catch_unwind_entry(data, run, message_data, set_message) }
        }
    };
}

//! The host side of dynamic plugins: [`load_plugin_library`] opens a `cdylib` built with
//! [`export_plugin!`](crate::export_plugin), refuses it unless its build tag equals the host's,
//! and returns its plugin records with a [`PanicGuard`] that runs calls into the library under
//! the library's own `catch_unwind`.
//!
//! Libraries are never unloaded: trait objects, vtables and `'static` records they handed out
//! live as long as the process.

use crate::plugin_export::{CatchFn, ExportedCrates, RegisterFn, RunFn, TagFn, BUILD_TAG, CATCH_SYMBOL};
use crate::plugin_export::{REGISTER_SYMBOL, TAG_SYMBOL};
use crate::registry::Plugin;
use anyhow::{anyhow, bail, Result};
use std::ffi::{c_void, CStr};
use std::path::Path;

/// Runs calls into one plugin library under that library's `catch_unwind`.
#[derive(Clone, Copy)]
pub struct PanicGuard {
    catch: CatchFn,
}

impl PanicGuard {
    /// Runs `f` (which calls into the library); a panic raised in the library comes back as
    /// `Err(message)`. A panic raised by *host* code inside `f` is a foreign exception to the
    /// library's std and aborts, so `f` should only call plugin code.
    pub fn call<F: FnOnce() -> R, R>(&self, f: F) -> std::result::Result<R, String> {
        struct Slot<F, R> {
            f: Option<F>,
            out: Option<R>,
        }
        unsafe extern "C-unwind" fn run<F: FnOnce() -> R, R>(data: *mut c_void) {
            // SAFETY: `data` is the `Slot<F, R>` below, alive and exclusively borrowed for the call.
            let slot = unsafe { &mut *(data as *mut Slot<F, R>) };
            if let Some(f) = slot.f.take() {
                slot.out = Some(f());
            }
        }
        unsafe extern "C" fn set_message(data: *mut c_void, ptr: *const u8, len: usize) {
            // SAFETY: `data` is the `String` below; `ptr..ptr+len` is the library's live message.
            let (out, bytes) = unsafe { (&mut *(data as *mut String), std::slice::from_raw_parts(ptr, len)) };
            *out = String::from_utf8_lossy(bytes).into_owned();
        }
        let mut slot = Slot { f: Some(f), out: None };
        let mut message = String::new();
        let run_fn: RunFn = run::<F, R>;
        // SAFETY: both pointers outlive the call and match the callbacks' expectations.
        let ok = unsafe {
            (self.catch)(
                &mut slot as *mut Slot<F, R> as *mut c_void,
                run_fn,
                &mut message as *mut String as *mut c_void,
                set_message,
            )
        };
        match (ok, slot.out) {
            (true, Some(out)) => Ok(out),
            (true, None) => Err("the plugin library did not run the call".to_string()),
            (false, _) => Err(message),
        }
    }
}

#[cfg(test)]
impl PanicGuard {
    /// A guard running closures under this crate's own `catch_unwind` (the body a plugin library
    /// exports), for unit tests of guarded wrappers without loading a library.
    pub(crate) fn in_process() -> PanicGuard {
        unsafe extern "C" fn catch(
            data: *mut c_void,
            run: crate::plugin_export::RunFn,
            message_data: *mut c_void,
            set_message: crate::plugin_export::SetMessageFn,
        ) -> bool {
            // SAFETY: forwarded from the `CatchFn` contract that `PanicGuard::call` keeps.
            unsafe { crate::plugin_export::catch_unwind_entry(data, run, message_data, set_message) }
        }
        PanicGuard { catch }
    }
}

/// One plugin crate of a loaded library (its records copied into host memory).
pub struct LibraryCrate {
    pub crate_name: String,
    pub version: String,
    pub plugins: Vec<Plugin>,
}

/// A loaded (and leaked, never unloaded) plugin library.
pub struct LoadedLibrary {
    /// The path as given, used as the plugins' origin.
    pub path: String,
    pub crates: Vec<LibraryCrate>,
    pub guard: PanicGuard,
}

/// The crate a library file most likely comes from (`libmy_plugin.so` → `my-plugin`), for the
/// rebuild command of error messages.
pub fn crate_name_guess(path: &Path) -> String {
    let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("<your-plugin-crate>");
    stem.strip_prefix("lib").unwrap_or(stem).replace('_', "-")
}

/// Opens a plugin library, checks its build tag and collects its plugin records.
pub fn load_plugin_library(path: &Path) -> Result<LoadedLibrary> {
    if !path.is_file() {
        bail!(
            "plugin library `{}` does not exist (or is not a file): build it with \
             `cargo build --release -p <plugin-crate>` and pass the `target/release/lib<crate>.so` it writes",
            path.display()
        );
    }
    // The file checked here must be the file loaded: `dlopen` searches the system library path
    // for a name without a `/` (`libm.so.6` would load the system libm, not `./libm.so.6`).
    let path = &std::fs::canonicalize(path).map_err(|e| anyhow!("cannot resolve `{}`: {e}", path.display()))?;
    let shown = path.display().to_string();
    // A truncated library would kill the process with SIGBUS inside `dlopen`.
    #[cfg(target_os = "linux")]
    crate::elf_check::check_shared_object(path)?;
    // SAFETY: loading runs the library's initialisers (its inventory registrations). That is the
    // point of `--plugin`; the user vouches for the file by naming it.
    let lib =
        unsafe { libloading::Library::new(path) }.map_err(|e| anyhow!("cannot load plugin library `{shown}`: {e}"))?;
    // Never unloaded (see the module doc).
    let lib: &'static libloading::Library = Box::leak(Box::new(lib));
    let symbol = |name: &str| {
        anyhow!(
            "`{shown}` is not a megatron plugin library: it exports no `{name}` symbol. A plugin crate \
             must have crate-type \"cdylib\" and invoke `megatron_core::export_plugin!()` once (see docs/plugins.md)"
        )
    };
    // SAFETY: the symbol types are the ABI `export_plugin!` defines; symbols are copied out as
    // plain function pointers, valid for the process since the library stays loaded.
    let (tag_fn, register_fn, catch_fn) = unsafe {
        let tag: TagFn = *lib.get::<TagFn>(TAG_SYMBOL.as_bytes()).map_err(|_| symbol(TAG_SYMBOL))?;
        let register: RegisterFn =
            *lib.get::<RegisterFn>(REGISTER_SYMBOL.as_bytes()).map_err(|_| symbol(REGISTER_SYMBOL))?;
        let catch: CatchFn = *lib.get::<CatchFn>(CATCH_SYMBOL.as_bytes()).map_err(|_| symbol(CATCH_SYMBOL))?;
        (tag, register, catch)
    };
    // SAFETY: the tag function only reads a static and returns a NUL-terminated string.
    let tag = unsafe { CStr::from_ptr(tag_fn()) }.to_string_lossy().into_owned();
    check_tag(&tag, path)?;
    let guard = PanicGuard { catch: catch_fn };
    // SAFETY: with equal tags both sides agree on the layout of `ExportedCrates` and `Plugin`;
    // the data is leaked `'static` memory of the library.
    let records = guard
        .call(|| unsafe { register_fn() })
        .map_err(|m| anyhow!("plugin library `{shown}` panicked while registering its plugins: {m}"))?;
    if records.is_null() {
        bail!("plugin library `{shown}` returned no plugin records");
    }
    let exported = unsafe { &*(records as *const ExportedCrates) };
    let crates = exported
        .crates
        .iter()
        .map(|c| LibraryCrate {
            crate_name: c.crate_name.to_string(),
            version: c.version.to_string(),
            plugins: c.plugins.to_vec(),
        })
        .collect::<Vec<_>>();
    if crates.iter().all(|c| c.plugins.is_empty()) {
        bail!(
            "plugin library `{shown}` registers no plugins: its crate needs one \
             `megatron_core::inventory::submit! {{ megatron_core::PluginCrate {{ .. }} }}`"
        );
    }
    Ok(LoadedLibrary { path: shown, crates, guard })
}

/// Refuses a library whose build tag differs from the host's, printing both and the fix.
pub fn check_tag(library_tag: &str, path: &Path) -> Result<()> {
    if library_tag == BUILD_TAG {
        return Ok(());
    }
    let differing: Vec<String> = BUILD_TAG
        .split(';')
        .zip(library_tag.split(';'))
        .filter(|(h, l)| h != l)
        .map(|(h, _)| h.split('=').next().unwrap_or(h).to_string())
        .collect();
    Err(anyhow!(
        "plugin library `{}` was built against a different megatron-core build and cannot be loaded \
         (differs in: {}).\n  library tag: {library_tag}\n  host tag:    {BUILD_TAG}\n\
         Rebuild it against this megatron (megatron-core {}, the same rustc and Cargo.lock): \
         `cargo build --release -p {}` in the megatron workspace (or, out of tree, with the host's Cargo.lock)",
        path.display(),
        if differing.is_empty() { "format".to_string() } else { differing.join(", ") },
        crate::CORE_VERSION,
        crate_name_guess(path),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_build_tag_has_every_field_and_a_lock_hash() {
        let fields: Vec<&str> = BUILD_TAG.split(';').map(|f| f.split('=').next().unwrap_or("")).collect();
        assert_eq!(fields, ["megatron-core", "rustc", "target", "panic", "features", "api", "lock"]);
        // The hash of core's sources: 16 hex digits.
        let api = BUILD_TAG.split(";api=").nth(1).and_then(|r| r.split(';').next()).unwrap_or("");
        assert!(api.len() == 16 && api.chars().all(|c| c.is_ascii_hexdigit()), "{BUILD_TAG}");
        assert!(BUILD_TAG.contains(&format!("megatron-core={};", crate::CORE_VERSION)));
        assert!(BUILD_TAG.contains(";rustc=rustc "), "{BUILD_TAG}");
        // Built inside the workspace, the Cargo.lock is found: a 16-hex-digit hash.
        let lock = BUILD_TAG.rsplit("lock=").next().unwrap_or("");
        assert!(lock.len() == 16 && lock.chars().all(|c| c.is_ascii_hexdigit()), "{BUILD_TAG}");
    }

    #[test]
    fn a_mismatching_tag_is_refused_with_both_tags_and_the_rebuild_command() {
        let path = Path::new("target/release/libmy_plugin.so");
        assert!(check_tag(BUILD_TAG, path).is_ok());
        let forged = BUILD_TAG.replace("lock=", "lock=0");
        let msg = format!("{:#}", check_tag(&forged, path).err().map(|e| format!("{e:#}")).unwrap_or_default());
        assert!(msg.contains("differs in: lock"), "{msg}");
        assert!(msg.contains(&format!("library tag: {forged}")) && msg.contains(&format!("host tag:    {BUILD_TAG}")));
        assert!(msg.contains("`cargo build --release -p my-plugin`"), "{msg}");
    }

    #[test]
    fn missing_and_foreign_files_are_clear_errors() {
        let err = |p: &Path| load_plugin_library(p).err().map(|e| format!("{e:#}")).unwrap_or_default();
        assert!(err(Path::new("no/such/lib.so")).contains("does not exist"));
        let dir = std::env::temp_dir().join(format!("megatron-core-loader-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let fake = dir.join("libfake.so");
        if std::fs::write(&fake, "not a library").is_ok() {
            assert!(err(&fake).contains("not an ELF shared library"), "{}", err(&fake));
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

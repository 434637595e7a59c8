//! Checks a plugin library's ELF structure before `dlopen` maps it. The dynamic loader maps
//! segments straight from the file: a truncated library whose segments reach past the end of
//! the file kills the process with SIGBUS when the loader touches them. Reading the headers
//! first turns that (and non-ELF files, wrong architectures, executables) into an error.

use anyhow::{bail, Context, Result};
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

const ET_DYN: u16 = 3;
const PT_LOAD: u32 = 1;
/// The host's `e_machine` (x86-64: 62, AArch64: 183).
const HOST_MACHINE: Option<u16> = if cfg!(target_arch = "x86_64") {
    Some(62)
} else if cfg!(target_arch = "aarch64") {
    Some(183)
} else {
    None
};

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Validates the ELF header, the program headers and every loadable segment's file range of
/// the 64-bit little-endian shared object at `path` against the file's size.
pub fn check_shared_object(path: &Path) -> Result<()> {
    let shown = path.display();
    let mut file = std::fs::File::open(path).with_context(|| format!("cannot open plugin library `{shown}`"))?;
    let size = file.metadata().with_context(|| format!("cannot stat `{shown}`"))?.len();
    let mut header = [0u8; 64];
    if size < 64 || file.read_exact(&mut header).is_err() {
        bail!("plugin library `{shown}` is not an ELF shared library: {size} bytes, too short for an ELF header");
    }
    if &header[..4] != b"\x7fELF" {
        bail!("plugin library `{shown}` is not an ELF shared library (no ELF magic number); pass the `.so` a plugin crate builds");
    }
    if header[4] != 2 || header[5] != 1 {
        bail!("plugin library `{shown}` is not a 64-bit little-endian ELF file; rebuild it for this machine");
    }
    let (e_type, machine) = (u16_at(&header, 16), u16_at(&header, 18));
    if let Some(host) = HOST_MACHINE.filter(|&h| h != machine) {
        bail!("plugin library `{shown}` is built for ELF machine {machine}, this host is {host}; rebuild it here");
    }
    if e_type != ET_DYN {
        bail!("`{shown}` is an ELF file of type {e_type}, not a shared library (type {ET_DYN}): build the plugin crate as a cdylib");
    }
    let truncated = |what: &str, end: u128| {
        anyhow::anyhow!(
            "plugin library `{shown}` is truncated or corrupted: its {what} ends at byte {end}, but the file has \
             {size} bytes (an interrupted copy or build?); rebuild or copy it again"
        )
    };
    let (phoff, phentsize, phnum) = (u64_at(&header, 32), u16_at(&header, 54), u16_at(&header, 56));
    let (shoff, shentsize, shnum) = (u64_at(&header, 40), u16_at(&header, 58), u16_at(&header, 60));
    if phnum == 0 || (phentsize as usize) < 56 {
        bail!("plugin library `{shown}` has no valid program headers (corrupted ELF file)");
    }
    let ph_end = phoff as u128 + phentsize as u128 * phnum as u128;
    if ph_end > size as u128 {
        return Err(truncated("program header table", ph_end));
    }
    if shoff != 0 {
        let sh_end = shoff as u128 + shentsize as u128 * shnum as u128;
        if sh_end > size as u128 {
            return Err(truncated("section header table", sh_end));
        }
    }
    let mut table = vec![0u8; phentsize as usize * phnum as usize];
    file.seek(SeekFrom::Start(phoff))
        .and_then(|_| file.read_exact(&mut table))
        .with_context(|| format!("cannot read `{shown}`"))?;
    for entry in table.chunks_exact(phentsize as usize) {
        if u32_at(entry, 0) != PT_LOAD {
            continue;
        }
        let end = u64_at(entry, 8) as u128 + u64_at(entry, 32) as u128;
        if end > size as u128 {
            return Err(truncated("loadable segment", end));
        }
    }
    Ok(())
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// A real shared object of this system (the C library every Rust binary here links).
    fn system_library() -> Option<std::path::PathBuf> {
        let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
        maps.lines().filter_map(|l| l.split_whitespace().nth(5)).find(|p| p.contains("libc.so")).map(Into::into)
    }

    #[test]
    fn real_libraries_pass_and_truncated_or_foreign_files_fail() {
        let Some(lib) = system_library() else {
            eprintln!("SKIP: no libc.so mapped into this process");
            return;
        };
        check_shared_object(&lib).unwrap();
        let bytes = std::fs::read(&lib).unwrap();
        let dir = tempfile_dir();
        for (name, content, needle) in [
            ("trunc.so", &bytes[..bytes.len() * 6 / 10], "truncated or corrupted"),
            ("tiny.so", &bytes[..40], "too short"),
            (
                "text.so",
                b"not a library, just some text to make it long enough for a header....".as_slice(),
                "no ELF magic",
            ),
        ] {
            let p = dir.join(name);
            std::fs::write(&p, content).unwrap();
            let err = format!("{:#}", check_shared_object(&p).unwrap_err());
            assert!(err.contains(needle), "{name}: {err}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn tempfile_dir() -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("megatron-elf-check-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }
}

//! Loading a shared library into the target ([`crate::Held::load_library`])
//! and finding its symbols: how a tool brings its own probe functions (C or
//! Rust, built as a `.so`) into a running process.

use std::path::{Path, PathBuf};

use crate::inspect::ProcessImage;
use crate::ptrace::{RemoteArg, RemoteCall, RemoteError, Tid, Tracer, World};

/// A library `dlopen`ed into the target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Library {
    /// Its path (canonical, as the target's loader opened it).
    pub path: PathBuf,
    /// The handle `dlopen` returned in the target.
    pub handle: u64,
    /// Where it is loaded (its lowest mapping).
    pub base: u64,
}

impl Library {
    /// The runtime address of the function or object `name` defined by the
    /// library (its symbol tables, then `.eh_frame` for stripped code), or
    /// None.
    pub fn symbol(&self, image: &mut ProcessImage, name: &str) -> Option<u64> {
        let module = image.modules().iter().find(|m| m.path() == self.path)?;
        let vaddr = module.image().ok()?.symbol_vaddr(name).ok()??;
        Some(module.runtime_address(vaddr))
    }
}

/// Why a library could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LibraryError {
    /// The path does not name a readable file.
    #[error(
        "cannot load {path}: {source} (give the path of a shared library built with -shared -fPIC)"
    )]
    Path {
        /// The path given.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The target's loader refused it.
    #[error("the target's dlopen refused {path}: {message}")]
    Dlopen {
        /// The library.
        path: PathBuf,
        /// `dlerror()`'s message in the target.
        message: String,
    },
    /// The target has no `dlopen`.
    #[error("the target's C library has no dlopen: weft needs glibc")]
    NoDlopen,
}

/// `dlopen(path, RTLD_NOW)` on thread `tid`, the others running (the loader
/// takes locks a stopped thread could hold, and a tool's library may do
/// anything in its constructors); returns the handle, or `dlerror()`'s
/// message.
pub(crate) fn dlopen(
    tracer: &mut Tracer,
    image: &mut ProcessImage,
    tid: Tid,
    path: &Path,
) -> Result<u64, crate::Error> {
    let mut bytes = path.as_os_str().as_encoded_bytes().to_vec();
    bytes.push(0);
    match call_dlopen(tracer, image, tid, bytes, World::Running)? {
        Some(Ok(handle)) => Ok(handle),
        Some(Err(message)) => Err(LibraryError::Dlopen {
            path: path.to_path_buf(),
            message,
        }
        .into()),
        None => Err(LibraryError::NoDlopen.into()),
    }
}

/// The target's `dlopen(path, RTLD_NOW)` (`path` NUL-terminated) on thread
/// `tid`, the others doing as `world` says: the handle, or `dlerror()`'s
/// message; `None` when the target's C library has no `dlopen`.
pub(crate) fn call_dlopen(
    tracer: &mut Tracer,
    image: &mut ProcessImage,
    tid: Tid,
    path: Vec<u8>,
    world: World,
) -> Result<Option<Result<u64, String>>, RemoteError> {
    let (dlopen, flags) = match image.symbol_address("libc.so", "dlopen") {
        Some(f) => (f, libc::RTLD_NOW as u64),
        // glibc < 2.34 keeps dlopen in libdl; libc has the internal one
        // (the high bit: __RTLD_DLOPEN, as libdl's dlopen passes it).
        None => match image.symbol_address("libc.so", "__libc_dlopen_mode") {
            Some(f) => (f, libc::RTLD_NOW as u64 | 0x8000_0000),
            None => return Ok(None),
        },
    };
    let handle = tracer.call_in(
        tid,
        &RemoteCall::new(
            "dlopen",
            dlopen,
            vec![RemoteArg::Bytes(path), RemoteArg::Value(flags)],
        ),
        world,
    )?;
    if handle != 0 {
        return Ok(Some(Ok(handle)));
    }
    let message = match image.symbol_address("libc.so", "dlerror") {
        Some(dlerror) => {
            let text = tracer.call(tid, &RemoteCall::new("dlerror", dlerror, vec![]), false)?;
            if text == 0 {
                "unknown error".to_string()
            } else {
                tracer
                    .memory()
                    .read_c_string(text, 1024)
                    .unwrap_or_default()
            }
        }
        None => "unknown error".to_string(),
    };
    Ok(Some(Err(message)))
}

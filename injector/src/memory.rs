//! Reading and writing another process's memory through `/proc/PID/mem`.
//!
//! `/proc/PID/mem` writes go through the kernel's `FOLL_FORCE` path, so they
//! can patch read-only text without `mprotect` in the target. A single
//! `pwrite` is atomic with respect to weft being killed: the kernel finishes
//! the copy before it delivers any signal, so a patch is written whole or
//! not at all.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;

/// An open handle on a process's address space.
#[derive(Debug)]
pub struct ProcessMemory {
    pid: i32,
    file: File,
}

/// Failure to access target memory.
#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    /// `/proc/PID/mem` could not be opened.
    #[error("cannot open /proc/{pid}/mem: {source} (weft needs ptrace access to the process: the same user or CAP_SYS_PTRACE)")]
    Open {
        /// The process.
        pid: i32,
        /// What the kernel said.
        source: io::Error,
    },
    /// A read or write of `len` bytes at `address` failed or was short.
    #[error("cannot {op} {len} bytes at {address:#x} in process {pid}: {source}")]
    Access {
        /// "read" or "write".
        op: &'static str,
        /// The process.
        pid: i32,
        /// Start address.
        address: u64,
        /// Length in bytes.
        len: usize,
        /// What the kernel said.
        source: io::Error,
    },
}

impl ProcessMemory {
    /// Opens `/proc/PID/mem` for reading and writing.
    pub fn open(pid: i32) -> Result<Self, MemoryError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(crate::inspect::procfs::pid_file(pid, "mem"))
            .map_err(|source| MemoryError::Open { pid, source })?;
        Ok(ProcessMemory { pid, file })
    }

    /// Opens `/proc/PID/mem` for reading only (which needs no attach, only
    /// the right to trace the process).
    pub fn open_read_only(pid: i32) -> Result<Self, MemoryError> {
        let file = File::open(crate::inspect::procfs::pid_file(pid, "mem"))
            .map_err(|source| MemoryError::Open { pid, source })?;
        Ok(ProcessMemory { pid, file })
    }

    /// Reads exactly `buf.len()` bytes at `address`.
    pub fn read(&self, address: u64, buf: &mut [u8]) -> Result<(), MemoryError> {
        self.file
            .read_exact_at(buf, address)
            .map_err(|source| MemoryError::Access {
                op: "read",
                pid: self.pid,
                address,
                len: buf.len(),
                source,
            })
    }

    /// Reads `len` bytes at `address` into a new vector.
    pub fn read_vec(&self, address: u64, len: usize) -> Result<Vec<u8>, MemoryError> {
        let mut buf = vec![0; len];
        self.read(address, &mut buf)?;
        Ok(buf)
    }

    /// Reads a little-endian `u64` at `address`.
    pub fn read_u64(&self, address: u64) -> Result<u64, MemoryError> {
        let mut buf = [0; 8];
        self.read(address, &mut buf)?;
        Ok(u64::from_le_bytes(buf))
    }

    /// Reads a NUL-terminated string of at most `max` bytes at `address`.
    pub fn read_c_string(&self, address: u64, max: usize) -> Result<String, MemoryError> {
        let mut out = Vec::new();
        let mut chunk = [0u8; 256];
        while out.len() < max {
            let want = chunk.len().min(max - out.len());
            // A string may end just before an unmapped page: read
            // byte-wise when a whole chunk fails.
            let got = match self
                .file
                .read_at(&mut chunk[..want], address + out.len() as u64)
            {
                Ok(0) | Err(_) if out.is_empty() && want > 1 => {
                    let mut one = [0u8; 1];
                    self.read(address + out.len() as u64, &mut one)?;
                    chunk[0] = one[0];
                    1
                }
                Ok(0) => break,
                Ok(n) => n,
                Err(_) => break,
            };
            if let Some(nul) = chunk[..got].iter().position(|&b| b == 0) {
                out.extend_from_slice(&chunk[..nul]);
                return Ok(String::from_utf8_lossy(&out).into_owned());
            }
            out.extend_from_slice(&chunk[..got]);
        }
        Ok(String::from_utf8_lossy(&out).into_owned())
    }

    /// Writes all of `data` at `address` with one `pwrite`.
    pub fn write(&self, address: u64, data: &[u8]) -> Result<(), MemoryError> {
        let access = |source| MemoryError::Access {
            op: "write",
            pid: self.pid,
            address,
            len: data.len(),
            source,
        };
        match self.file.write_at(data, address) {
            Ok(n) if n == data.len() => Ok(()),
            Ok(_) => Err(access(io::Error::new(
                io::ErrorKind::WriteZero,
                "short write",
            ))),
            Err(e) => Err(access(e)),
        }
    }
}

//! The running kernel's BTF (`/sys/kernel/btf/vmlinux`): what weft needs
//! of it, read by hand because it is little — function ids for fentry and
//! fexit, a few `task_struct` offsets, the argument order of
//! `sched_switch` — and a general BTF library would be a large dependency
//! for it (format: `Documentation/bpf/btf.rst`).

use std::collections::HashMap;

const MAGIC: u16 = 0xeb9f;

const KIND_INT: u32 = 1;
const KIND_PTR: u32 = 2;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_TYPEDEF: u32 = 8;
const KIND_VOLATILE: u32 = 9;
const KIND_CONST: u32 = 10;
const KIND_RESTRICT: u32 = 11;
const KIND_FUNC: u32 = 12;
const KIND_FUNC_PROTO: u32 = 13;
const KIND_VAR: u32 = 14;
const KIND_DATASEC: u32 = 15;
const KIND_DECL_TAG: u32 = 17;
const KIND_TYPE_TAG: u32 = 18;
const KIND_ENUM64: u32 = 19;

/// One type: its kind, name, `size_or_type` and the offset of its
/// trailing data in the type section.
#[derive(Clone, Copy, Debug)]
struct Type {
    kind: u32,
    name: u32,
    vlen: u32,
    kind_flag: bool,
    size_or_type: u32,
    extra: usize,
}

/// A parsed BTF blob.
pub(crate) struct Btf {
    data: Vec<u8>,
    strings_at: usize,
    strings_len: usize,
    /// Type id → type (index 0 is `void`).
    types: Vec<Type>,
    functions: HashMap<String, u32>,
}

/// Why BTF could not be used.
#[derive(Debug, thiserror::Error)]
pub enum BtfError {
    /// The file is missing or unreadable.
    #[error(
        "cannot read the kernel's BTF ({path}): {source}; the kernel needs CONFIG_DEBUG_INFO_BTF"
    )]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The bytes are not BTF as weft knows it.
    #[error("the kernel's BTF is malformed or of an unknown version ({0})")]
    Malformed(&'static str),
}

fn u32_at(data: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(data.get(at..at + 4)?.try_into().ok()?))
}

impl Btf {
    /// The running kernel's BTF.
    pub(crate) fn vmlinux() -> Result<Btf, BtfError> {
        let path = "/sys/kernel/btf/vmlinux";
        let data = std::fs::read(path).map_err(|source| BtfError::Read {
            path: path.to_string(),
            source,
        })?;
        Btf::parse(data)
    }

    pub(crate) fn parse(data: Vec<u8>) -> Result<Btf, BtfError> {
        let bad = BtfError::Malformed;
        if data.len() < 24 || u16::from_le_bytes([data[0], data[1]]) != MAGIC || data[2] != 1 {
            return Err(bad("no BTF magic"));
        }
        let hdr_len = u32_at(&data, 4).ok_or(bad("header"))? as usize;
        let type_off = u32_at(&data, 8).ok_or(bad("header"))? as usize;
        let type_len = u32_at(&data, 12).ok_or(bad("header"))? as usize;
        let str_off = u32_at(&data, 16).ok_or(bad("header"))? as usize;
        let str_len = u32_at(&data, 20).ok_or(bad("header"))? as usize;
        let types_at = hdr_len + type_off;
        let strings_at = hdr_len + str_off;
        if types_at + type_len > data.len() || strings_at + str_len > data.len() {
            return Err(bad("sections out of the file"));
        }
        let mut types = vec![Type {
            kind: 0,
            name: 0,
            vlen: 0,
            kind_flag: false,
            size_or_type: 0,
            extra: 0,
        }];
        let mut at = types_at;
        let end = types_at + type_len;
        while at < end {
            let name = u32_at(&data, at).ok_or(bad("type"))?;
            let info = u32_at(&data, at + 4).ok_or(bad("type"))?;
            let size_or_type = u32_at(&data, at + 8).ok_or(bad("type"))?;
            let kind = (info >> 24) & 0x1f;
            let vlen = info & 0xffff;
            let extra = at + 12;
            let trailing = match kind {
                KIND_INT | KIND_VAR | KIND_DECL_TAG => 4,
                KIND_ARRAY => 12,
                KIND_STRUCT | KIND_UNION | KIND_DATASEC | KIND_ENUM64 => 12 * vlen as usize,
                KIND_ENUM | KIND_FUNC_PROTO => 8 * vlen as usize,
                KIND_PTR | 7 | KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT
                | KIND_FUNC | 16 | KIND_TYPE_TAG => 0,
                _ => return Err(bad("unknown type kind")),
            };
            types.push(Type {
                kind,
                name,
                vlen,
                kind_flag: info >> 31 == 1,
                size_or_type,
                extra,
            });
            at = extra + trailing;
        }
        let mut btf = Btf {
            data,
            strings_at,
            strings_len: str_len,
            types,
            functions: HashMap::new(),
        };
        let mut functions = HashMap::new();
        for (id, t) in btf.types.iter().enumerate() {
            if t.kind == KIND_FUNC {
                functions.insert(btf.string(t.name).to_string(), id as u32);
            }
        }
        btf.functions = functions;
        Ok(btf)
    }

    fn string(&self, off: u32) -> &str {
        let start = self.strings_at + off as usize;
        let end_limit = self.strings_at + self.strings_len;
        if start >= end_limit {
            return "";
        }
        let bytes = &self.data[start..end_limit];
        let len = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
        std::str::from_utf8(&bytes[..len]).unwrap_or("")
    }

    /// The BTF id of kernel function `name` (what fentry/fexit attach to).
    pub(crate) fn function(&self, name: &str) -> Option<u32> {
        self.functions.get(name).copied()
    }

    /// Every function BTF describes.
    pub(crate) fn function_names(&self) -> impl Iterator<Item = &str> {
        self.functions.keys().map(String::as_str)
    }

    /// The BTF id of typedef `name` (`btf_trace_sched_switch`: what a
    /// `tp_btf` program attaches to).
    pub(crate) fn typedef(&self, name: &str) -> Option<u32> {
        self.named(KIND_TYPEDEF, name)
    }

    fn named(&self, kind: u32, name: &str) -> Option<u32> {
        self.types
            .iter()
            .position(|t| t.kind == kind && self.string(t.name) == name)
            .map(|i| i as u32)
    }

    /// The type behind typedefs and qualifiers.
    fn resolve(&self, mut id: u32) -> Option<u32> {
        for _ in 0..32 {
            let t = self.types.get(id as usize)?;
            match t.kind {
                KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG => {
                    id = t.size_or_type
                }
                _ => return Some(id),
            }
        }
        None
    }

    /// (name, type, bit offset) of each member of struct/union `id`.
    fn members(&self, id: u32) -> Vec<(&str, u32, u32)> {
        let Some(t) = self.types.get(id as usize) else {
            return Vec::new();
        };
        if t.kind != KIND_STRUCT && t.kind != KIND_UNION {
            return Vec::new();
        }
        (0..t.vlen as usize)
            .filter_map(|i| {
                let at = t.extra + 12 * i;
                let name = u32_at(&self.data, at)?;
                let ty = u32_at(&self.data, at + 4)?;
                let offset = u32_at(&self.data, at + 8)?;
                let bits = if t.kind_flag {
                    offset & 0xff_ffff
                } else {
                    offset
                };
                Some((self.string(name), ty, bits))
            })
            .collect()
    }

    /// The byte offset of `member` in struct/union `id`, looking into
    /// anonymous members too.
    fn member_offset(&self, id: u32, member: &str) -> Option<(u32, u32)> {
        for (name, ty, bits) in self.members(id) {
            if name == member {
                return Some((bits / 8, ty));
            }
            if name.is_empty() {
                if let Some(inner) = self.resolve(ty) {
                    if let Some((off, ty)) = self.member_offset(inner, member) {
                        return Some((bits / 8 + off, ty));
                    }
                }
            }
        }
        None
    }

    /// The byte offset of a member path (`["thread", "fsbase"]`) in struct
    /// `name`.
    pub(crate) fn offset_of(&self, name: &str, path: &[&str]) -> Option<u32> {
        let mut id = self.named(KIND_STRUCT, name)?;
        let mut total = 0;
        for member in path {
            let (off, ty) = self.member_offset(id, member)?;
            total += off;
            id = self.resolve(ty)?;
        }
        Some(total)
    }

    /// The BTF id of kernel variable `var` and the byte offset of `member`
    /// in it (a struct's).
    pub(crate) fn variable_member(&self, var: &str, member: &str) -> Option<(u32, u32)> {
        let id = self.named(KIND_VAR, var)?;
        let ty = self.resolve(self.types.get(id as usize)?.size_or_type)?;
        let (offset, _) = self.member_offset(ty, member)?;
        Some((id, offset))
    }

    /// The index among a raw tracepoint's arguments of parameter `param` of
    /// tracepoint `name`. The probe function `__bpf_trace_NAME` names its
    /// parameters (the first, the tracepoint's private data, is not an
    /// argument); the `btf_trace_NAME` typedef often does not, and then
    /// `param` is found by its type: for `sched_switch`, `prev` and `next`
    /// are the first and second `struct task_struct *`.
    pub(crate) fn tracepoint_arg(&self, name: &str, param: &str) -> Option<u32> {
        let params = |proto: u32| -> Option<Vec<(String, u32)>> {
            let t = self.types.get(proto as usize)?;
            (t.kind == KIND_FUNC_PROTO).then(|| {
                (0..t.vlen as usize)
                    .filter_map(|i| {
                        let n = u32_at(&self.data, t.extra + 8 * i)?;
                        let ty = u32_at(&self.data, t.extra + 8 * i + 4)?;
                        Some((self.string(n).to_string(), ty))
                    })
                    .collect()
            })
        };
        let from_func = self
            .function(&format!("__bpf_trace_{name}"))
            .and_then(|f| params(self.types.get(f as usize)?.size_or_type));
        let from_typedef = || {
            let typedef = self.named(KIND_TYPEDEF, &format!("btf_trace_{name}"))?;
            let ptr = self.types.get(self.resolve(typedef)? as usize)?;
            (ptr.kind == KIND_PTR).then_some(())?;
            params(self.resolve(ptr.size_or_type)?)
        };
        let list = from_func.or_else(from_typedef)?;
        if let Some(i) = list.iter().position(|(n, _)| n == param) {
            return (i as u32).checked_sub(1);
        }
        let nth_task = match param {
            "prev" => 0,
            "next" => 1,
            _ => return None,
        };
        let task = self.named(KIND_STRUCT, "task_struct")?;
        let is_task_ptr = |ty: u32| {
            self.resolve(ty)
                .and_then(|p| self.types.get(p as usize))
                .is_some_and(|p| p.kind == KIND_PTR && self.resolve(p.size_or_type) == Some(task))
        };
        list.iter()
            .enumerate()
            .filter(|(_, (_, ty))| is_task_ptr(*ty))
            .nth(nth_task)
            .and_then(|(i, _)| (i as u32).checked_sub(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_running_kernels_btf() {
        let Ok(btf) = Btf::vmlinux() else {
            eprintln!("no /sys/kernel/btf/vmlinux here: nothing to check");
            return;
        };
        assert!(btf.function("do_sys_openat2").is_some());
        let pid = btf.offset_of("task_struct", &["pid"]).unwrap();
        let tgid = btf.offset_of("task_struct", &["tgid"]).unwrap();
        // pid_t pid; pid_t tgid; next to each other in every kernel.
        assert_eq!(tgid, pid + 4);
        let fsbase = btf.offset_of("task_struct", &["thread", "fsbase"]).unwrap();
        assert!(fsbase > tgid);
        assert_eq!(btf.tracepoint_arg("sched_switch", "next"), Some(2));
        assert_eq!(btf.tracepoint_arg("sched_switch", "prev"), Some(1));
        // A KVM guest kernel's steal counter: the first member.
        if let Some((id, offset)) = btf.variable_member("steal_time", "steal") {
            assert!(id > 0);
            assert_eq!(offset, 0);
        }
        assert!(btf
            .variable_member("steal_time", "no_such_member")
            .is_none());
        assert!(btf.variable_member("no_such_variable", "steal").is_none());
    }

    #[test]
    fn refuses_what_is_not_btf() {
        assert!(Btf::parse(vec![0; 64]).is_err());
        let mut header = vec![0u8; 24];
        header[0..2].copy_from_slice(&MAGIC.to_le_bytes());
        header[2] = 1;
        header[4..8].copy_from_slice(&24u32.to_le_bytes());
        // A type section running past the end.
        header[12..16].copy_from_slice(&1000u32.to_le_bytes());
        assert!(Btf::parse(header).is_err());
    }
}

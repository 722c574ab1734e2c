//! A small reader for the kernel's BTF (`/sys/kernel/btf/vmlinux`): finds a
//! struct by name and the byte offset and size of a member, looking through
//! anonymous struct and union members (sk_buff keeps `dev`, `protocol` and
//! the header offsets inside anonymous unions and `struct_group`s).
//!
//! Why not aya-obj: aya 0.14's `aya_obj::btf::Btf` parses the same format,
//! but its `type_by_id` and the members of `Struct` are crate-private, so a
//! member offset cannot be read through its public API.
//!
//! Format (Documentation/bpf/btf.rst): a header (magic 0xEB9F, version,
//! flags, hdr_len, then type and string sections as offsets from the end of
//! the header), a type section of `struct btf_type` records (name_off, info
//! = vlen | kind << 24 | kind_flag << 31, size/type) each followed by
//! kind-specific data, and a string section. Type ids start at 1. A member's
//! `offset` is in bits; when the struct's kind_flag is set its low 24 bits
//! are the bit offset and the high 8 the bitfield size.
//!
//! Invariants: only little-endian BTF (the blob of the running kernel on the
//! architectures we build for); every read is bounds-checked, a malformed
//! blob is an error, never a panic.
//!
//! Non-goals: writing BTF, CO-RE relocation, resolving functions or
//! variables.

use std::{
    fs, io,
    path::{Path, PathBuf},
};

/// Where the running kernel exposes its own BTF.
pub const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

/// Names another file for the kernel's BTF, for the tests that run the
/// shaper as on a kernel without it (a path that does not exist).
pub const KERNEL_BTF_ENV: &str = "SHAPER_KERNEL_BTF";

/// The running kernel's BTF file: [`VMLINUX_BTF`], or what
/// [`KERNEL_BTF_ENV`] names. Only the tracer reads it.
pub fn kernel_btf_path() -> PathBuf {
    std::env::var_os(KERNEL_BTF_ENV).map_or_else(|| PathBuf::from(VMLINUX_BTF), PathBuf::from)
}

const MAGIC: u16 = 0xEB9F;
const KIND_INT: u32 = 1;
const KIND_PTR: u32 = 2;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_FWD: u32 = 7;
const KIND_TYPEDEF: u32 = 8;
const KIND_VOLATILE: u32 = 9;
const KIND_CONST: u32 = 10;
const KIND_RESTRICT: u32 = 11;
const KIND_FUNC: u32 = 12;
const KIND_FUNC_PROTO: u32 = 13;
const KIND_VAR: u32 = 14;
const KIND_DATASEC: u32 = 15;
const KIND_FLOAT: u32 = 16;
const KIND_DECL_TAG: u32 = 17;
const KIND_TYPE_TAG: u32 = 18;
const KIND_ENUM64: u32 = 19;
/// Deepest nesting of anonymous members or type modifiers followed.
const MAX_DEPTH: u32 = 32;

/// What can go wrong reading BTF or looking a member up.
#[derive(Debug, thiserror::Error)]
pub enum BtfError {
    /// The file could not be read.
    #[error(
        "cannot read kernel BTF at {path}: the tracer needs a kernel built with \
         CONFIG_DEBUG_INFO_BTF=y, or that build's BTF given with `shaper trace --btf FILE`"
    )]
    Read {
        /// The path.
        path: String,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The blob is not valid (little-endian) BTF.
    #[error("malformed BTF: {detail}")]
    Malformed {
        /// What is wrong.
        detail: String,
    },
    /// No struct of that name.
    #[error("BTF has no struct {name}")]
    NoStruct {
        /// The struct's name.
        name: String,
    },
    /// The struct has no such member (also not in anonymous members).
    #[error("struct {strukt} has no member {member} in BTF")]
    NoMember {
        /// The struct.
        strukt: String,
        /// The member.
        member: String,
    },
    /// The member is a bitfield or not byte-aligned.
    #[error("{strukt}.{member} is a bitfield or not byte-aligned (bit offset {bit_offset})")]
    NotByteAligned {
        /// The struct.
        strukt: String,
        /// The member.
        member: String,
        /// Its bit offset.
        bit_offset: u32,
    },
}

fn malformed(detail: impl Into<String>) -> BtfError {
    BtfError::Malformed {
        detail: detail.into(),
    }
}

/// A member found in a struct: where it is and how big.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Member {
    /// Byte offset from the start of the outer struct.
    pub offset_bytes: u32,
    /// Size of the member's type in bytes (pointers: 8).
    pub size_bytes: u32,
}

/// One type record: where its fixed part starts in the type section.
#[derive(Clone, Copy, Debug)]
struct TypeRec {
    name_off: u32,
    kind: u32,
    vlen: u32,
    kind_flag: bool,
    size_or_type: u32,
    /// Offset of the kind-specific data in the type section.
    data: usize,
}

/// Parsed BTF: type index and the raw sections.
pub struct Btf {
    types: Vec<TypeRec>,
    type_sec: Vec<u8>,
    strings: Vec<u8>,
}

fn u32_at(b: &[u8], off: usize) -> Option<u32> {
    let s = b.get(off..off.checked_add(4)?)?;
    Some(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
}

impl Btf {
    /// Reads and parses the running kernel's BTF ([`kernel_btf_path`]).
    pub fn from_sys() -> Result<Btf, BtfError> {
        Btf::from_file(&kernel_btf_path())
    }

    /// Reads and parses a BTF file.
    pub fn from_file(path: &Path) -> Result<Btf, BtfError> {
        let data = fs::read(path).map_err(|source| BtfError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Btf::parse(&data)
    }

    /// Parses a BTF blob.
    pub fn parse(data: &[u8]) -> Result<Btf, BtfError> {
        if data.len() < 24 {
            return Err(malformed("shorter than the header"));
        }
        let magic = u16::from_le_bytes([data[0], data[1]]);
        if magic != MAGIC {
            return Err(malformed(format!(
                "magic {magic:#06x}, want {MAGIC:#06x} (little-endian)"
            )));
        }
        let field = |i: usize| u32_at(data, 4 + 4 * i).ok_or_else(|| malformed("header"));
        let hdr_len = field(0)? as usize;
        let (type_off, type_len) = (field(1)? as usize, field(2)? as usize);
        let (str_off, str_len) = (field(3)? as usize, field(4)? as usize);
        let section = |off: usize, len: usize, what: &str| {
            let start = hdr_len
                .checked_add(off)
                .ok_or_else(|| malformed(format!("{what} offset")))?;
            let end = start
                .checked_add(len)
                .ok_or_else(|| malformed(format!("{what} length")))?;
            data.get(start..end)
                .map(<[u8]>::to_vec)
                .ok_or_else(|| malformed(format!("{what} section past the end")))
        };
        let type_sec = section(type_off, type_len, "type")?;
        let strings = section(str_off, str_len, "string")?;
        let mut types = vec![TypeRec {
            name_off: 0,
            kind: 0,
            vlen: 0,
            kind_flag: false,
            size_or_type: 0,
            data: 0,
        }];
        let mut pos = 0usize;
        while pos < type_sec.len() {
            let rd = |o: usize| u32_at(&type_sec, pos + o).ok_or_else(|| malformed("type record"));
            let (name_off, info, size_or_type) = (rd(0)?, rd(4)?, rd(8)?);
            let kind = (info >> 24) & 0x1f;
            let vlen = info & 0xffff;
            let extra = match kind {
                KIND_INT | KIND_VAR | KIND_DECL_TAG => 4,
                KIND_ARRAY => 12,
                KIND_STRUCT | KIND_UNION | KIND_DATASEC | KIND_ENUM64 => 12 * vlen as usize,
                KIND_ENUM | KIND_FUNC_PROTO => 8 * vlen as usize,
                KIND_PTR | KIND_FWD | KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT
                | KIND_FUNC | KIND_FLOAT | KIND_TYPE_TAG => 0,
                other => return Err(malformed(format!("unknown kind {other} at {pos}"))),
            };
            types.push(TypeRec {
                name_off,
                kind,
                vlen,
                kind_flag: info >> 31 != 0,
                size_or_type,
                data: pos + 12,
            });
            pos += 12 + extra;
        }
        if pos != type_sec.len() {
            return Err(malformed("type section ends inside a record"));
        }
        Ok(Btf {
            types,
            type_sec,
            strings,
        })
    }

    /// Number of types, not counting void.
    pub fn type_count(&self) -> usize {
        self.types.len() - 1
    }

    fn name(&self, off: u32) -> &[u8] {
        let rest = self.strings.get(off as usize..).unwrap_or(&[]);
        let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
        &rest[..end]
    }

    fn ty(&self, id: u32) -> Result<&TypeRec, BtfError> {
        self.types
            .get(id as usize)
            .ok_or_else(|| malformed(format!("type id {id} out of range")))
    }

    /// The id of the (complete) struct named `name`.
    pub fn struct_id(&self, name: &str) -> Result<u32, BtfError> {
        self.types
            .iter()
            .position(|t| t.kind == KIND_STRUCT && self.name(t.name_off) == name.as_bytes())
            .map(|i| i as u32)
            .ok_or_else(|| BtfError::NoStruct { name: name.into() })
    }

    /// True if the BTF has a typedef named `name` (the kernel declares one,
    /// `btf_trace_<tracepoint>`, for each raw tracepoint).
    pub fn has_typedef(&self, name: &str) -> bool {
        self.types
            .iter()
            .any(|t| t.kind == KIND_TYPEDEF && self.name(t.name_off) == name.as_bytes())
    }

    /// Follows typedefs and qualifiers to the underlying type.
    fn resolve(&self, mut id: u32) -> Result<u32, BtfError> {
        for _ in 0..MAX_DEPTH {
            let t = self.ty(id)?;
            match t.kind {
                KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG => {
                    id = t.size_or_type
                }
                _ => return Ok(id),
            }
        }
        Err(malformed("typedef chain too deep"))
    }

    /// Size in bytes of type `id`.
    fn size_of(&self, id: u32) -> Result<u32, BtfError> {
        let id = self.resolve(id)?;
        let t = self.ty(id)?;
        match t.kind {
            KIND_INT | KIND_STRUCT | KIND_UNION | KIND_ENUM | KIND_ENUM64 | KIND_FLOAT => {
                Ok(t.size_or_type)
            }
            KIND_PTR => Ok(8),
            KIND_ARRAY => {
                let elem = u32_at(&self.type_sec, t.data).ok_or_else(|| malformed("array"))?;
                let n = u32_at(&self.type_sec, t.data + 8).ok_or_else(|| malformed("array"))?;
                Ok(self.size_of(elem)?.saturating_mul(n))
            }
            other => Err(malformed(format!("type {id} of kind {other} has no size"))),
        }
    }

    /// Byte offset and size of `member` in struct `strukt`, found also inside
    /// anonymous struct/union members (at any depth).
    pub fn member(&self, strukt: &str, member: &str) -> Result<Member, BtfError> {
        let id = self.struct_id(strukt)?;
        match self.find(id, member.as_bytes(), 0, 0)? {
            Some((bits, size)) if bits % 8 == 0 => Ok(Member {
                offset_bytes: bits / 8,
                size_bytes: size,
            }),
            Some((bits, _)) => Err(BtfError::NotByteAligned {
                strukt: strukt.into(),
                member: member.into(),
                bit_offset: bits,
            }),
            None => Err(BtfError::NoMember {
                strukt: strukt.into(),
                member: member.into(),
            }),
        }
    }

    /// Searches struct/union `id` (at bit offset `base` in the outer struct)
    /// for `name`. Returns the bit offset and byte size; a bitfield comes
    /// back with its lowest offset bit set, so the caller refuses it.
    fn find(
        &self,
        id: u32,
        name: &[u8],
        base: u32,
        depth: u32,
    ) -> Result<Option<(u32, u32)>, BtfError> {
        if depth > MAX_DEPTH {
            return Err(malformed("anonymous members nested too deep"));
        }
        let t = *self.ty(id)?;
        if t.kind != KIND_STRUCT && t.kind != KIND_UNION {
            return Ok(None);
        }
        // Named members first, then anonymous ones, so a direct hit wins.
        let mut anonymous = Vec::new();
        for i in 0..t.vlen as usize {
            let at = t.data + 12 * i;
            let rd = |o| u32_at(&self.type_sec, at + o).ok_or_else(|| malformed("member"));
            let (name_off, type_id, raw_off) = (rd(0)?, rd(4)?, rd(8)?);
            let (bit_off, bitfield_size) = if t.kind_flag {
                (raw_off & 0x00ff_ffff, raw_off >> 24)
            } else {
                (raw_off, 0)
            };
            let abs = base
                .checked_add(bit_off)
                .ok_or_else(|| malformed("member offset overflows"))?;
            let mname = self.name(name_off);
            if mname.is_empty() {
                anonymous.push((type_id, abs));
            } else if mname == name {
                if bitfield_size != 0 {
                    // Report a non-byte offset so `member` refuses it.
                    return Ok(Some((abs | 1, bitfield_size.div_ceil(8))));
                }
                return Ok(Some((abs, self.size_of(type_id)?)));
            }
        }
        for (type_id, abs) in anonymous {
            let inner = self.resolve(type_id)?;
            if let Some(hit) = self.find(inner, name, abs, depth + 1)? {
                return Ok(Some(hit));
            }
        }
        Ok(None)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Builds BTF blobs by hand for tests.
    #[derive(Default)]
    pub(crate) struct Builder {
        types: Vec<u8>,
        strings: Vec<u8>,
        next_id: u32,
    }

    impl Builder {
        pub(crate) fn new() -> Self {
            Builder {
                types: Vec::new(),
                strings: vec![0],
                next_id: 1,
            }
        }
        fn str(&mut self, s: &str) -> u32 {
            if s.is_empty() {
                return 0;
            }
            let off = self.strings.len() as u32;
            self.strings.extend_from_slice(s.as_bytes());
            self.strings.push(0);
            off
        }
        fn head(&mut self, name: &str, kind: u32, vlen: u32, kflag: bool, st: u32) -> u32 {
            let n = self.str(name);
            let info = vlen | (kind << 24) | (u32::from(kflag) << 31);
            for v in [n, info, st] {
                self.types.extend_from_slice(&v.to_le_bytes());
            }
            self.next_id += 1;
            self.next_id - 1
        }
        pub(crate) fn int(&mut self, name: &str, bytes: u32) -> u32 {
            let id = self.head(name, KIND_INT, 0, false, bytes);
            self.types.extend_from_slice(&(bytes * 8).to_le_bytes());
            id
        }
        pub(crate) fn ptr(&mut self, to: u32) -> u32 {
            self.head("", KIND_PTR, 0, false, to)
        }
        pub(crate) fn typedef(&mut self, name: &str, to: u32) -> u32 {
            self.head(name, KIND_TYPEDEF, 0, false, to)
        }
        /// Members: (name, type, offset field as stored).
        pub(crate) fn aggregate(
            &mut self,
            union: bool,
            name: &str,
            size: u32,
            kflag: bool,
            members: &[(&str, u32, u32)],
        ) -> u32 {
            let kind = if union { KIND_UNION } else { KIND_STRUCT };
            let id = self.head(name, kind, members.len() as u32, kflag, size);
            for &(m, ty, off) in members {
                let n = self.str(m);
                for v in [n, ty, off] {
                    self.types.extend_from_slice(&v.to_le_bytes());
                }
            }
            id
        }
        pub(crate) fn finish(&self) -> Vec<u8> {
            let mut out = Vec::new();
            out.extend_from_slice(&MAGIC.to_le_bytes());
            out.extend_from_slice(&[1, 0]);
            let tl = self.types.len() as u32;
            let sl = self.strings.len() as u32;
            for v in [24u32, 0, tl, tl, sl] {
                out.extend_from_slice(&v.to_le_bytes());
            }
            out.extend_from_slice(&self.types);
            out.extend_from_slice(&self.strings);
            out
        }
    }

    /// A miniature sk_buff: `len` plain, `dev` in an anonymous union inside
    /// an anonymous struct, `protocol` in a struct_group-style union, and a
    /// bitfield struct with kind_flag set.
    fn mini() -> Vec<u8> {
        let mut b = Builder::new();
        let u32t = b.int("unsigned int", 4);
        let u16t = b.int("short unsigned int", 2);
        let be16 = b.typedef("__be16", u16t);
        let u8t = b.int("unsigned char", 1);
        let dev = b.aggregate(false, "net_device", 64, false, &[("ifindex", u32t, 256)]);
        let devp = b.ptr(dev);
        let dev_union = b.aggregate(
            true,
            "",
            8,
            false,
            &[("dev", devp, 0), ("scratch", u32t, 0)],
        );
        let anon_struct = b.aggregate(
            false,
            "",
            16,
            false,
            &[("next", devp, 0), ("", dev_union, 64)],
        );
        let group_inner = b.aggregate(
            false,
            "",
            4,
            false,
            &[("protocol", be16, 0), ("mac", u16t, 16)],
        );
        let group_named = b.aggregate(
            false,
            "",
            4,
            false,
            &[("protocol", be16, 0), ("mac", u16t, 16)],
        );
        let group = b.aggregate(
            true,
            "",
            4,
            false,
            &[("", group_inner, 0), ("headers", group_named, 0)],
        );
        // Bitfields: a 1-bit flag at bit 3 and a byte-aligned u8 at bit 8.
        let bits = b.aggregate(
            false,
            "",
            4,
            true,
            &[("flag", u8t, (1 << 24) | 3), ("tos", u8t, 8)],
        );
        b.aggregate(
            false,
            "sk_buff",
            64,
            false,
            &[
                ("", anon_struct, 0),
                ("len", u32t, 128),
                ("", group, 160),
                ("", bits, 192),
            ],
        );
        b.finish()
    }

    #[test]
    fn finds_members_through_anonymous_unions_and_groups() {
        let btf = Btf::parse(&mini()).expect("valid blob");
        assert_eq!(btf.type_count(), 13);
        let m = |s, n| btf.member(s, n);
        assert_eq!(
            m("sk_buff", "len").expect("len"),
            Member {
                offset_bytes: 16,
                size_bytes: 4
            }
        );
        assert_eq!(
            m("sk_buff", "dev").expect("dev"),
            Member {
                offset_bytes: 8,
                size_bytes: 8
            }
        );
        // Through a typedef; the anonymous copy of the group is found.
        assert_eq!(
            m("sk_buff", "protocol").expect("protocol"),
            Member {
                offset_bytes: 20,
                size_bytes: 2
            }
        );
        assert_eq!(m("sk_buff", "mac").expect("mac").offset_bytes, 22);
        // The named group itself is a member too.
        assert_eq!(m("sk_buff", "headers").expect("headers").offset_bytes, 20);
        assert_eq!(
            m("net_device", "ifindex").expect("ifindex").offset_bytes,
            32
        );
        // kind_flag encoding: the byte-aligned member decodes, the bitfield
        // is refused.
        assert_eq!(
            m("sk_buff", "tos").expect("tos"),
            Member {
                offset_bytes: 25,
                size_bytes: 1
            }
        );
        assert!(matches!(
            m("sk_buff", "flag"),
            Err(BtfError::NotByteAligned { .. })
        ));
        assert!(matches!(
            m("sk_buff", "nope"),
            Err(BtfError::NoMember { .. })
        ));
        assert!(matches!(m("nope", "len"), Err(BtfError::NoStruct { .. })));
    }

    #[test]
    fn rejects_malformed_blobs() {
        let good = mini();
        assert!(Btf::parse(&good[..10]).is_err());
        let mut bad_magic = good.clone();
        bad_magic[0] = 0;
        assert!(matches!(
            Btf::parse(&bad_magic),
            Err(BtfError::Malformed { .. })
        ));
        // Type section longer than the file.
        let mut long = good.clone();
        long[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(Btf::parse(&long).is_err());
        // A record cut in half.
        let mut cut = good.clone();
        let tl = u32::from_le_bytes([good[12], good[13], good[14], good[15]]);
        cut[12..16].copy_from_slice(&(tl - 6).to_le_bytes());
        assert!(Btf::parse(&cut).is_err());
        // An unknown kind.
        let mut unknown = good;
        unknown[24 + 7] = 30;
        assert!(Btf::parse(&unknown).is_err());
    }

    /// The running kernel's BTF: the offsets agree with what the compiler
    /// computes for the same structs from `bpftool btf dump ... format c`
    /// (when bpftool and cc are present; else only sanity checks).
    #[test]
    fn host_vmlinux_offsets_match_the_c_compiler() {
        let Ok(btf) = Btf::from_sys() else {
            eprintln!("skipped: no {VMLINUX_BTF}");
            return;
        };
        let wanted = [
            ("sk_buff", "len"),
            ("sk_buff", "dev"),
            ("sk_buff", "head"),
            ("sk_buff", "network_header"),
            ("sk_buff", "transport_header"),
            ("sk_buff", "protocol"),
            ("net_device", "ifindex"),
        ];
        let ours: Vec<Member> = wanted
            .iter()
            .map(|(s, m)| btf.member(s, m).expect("member found"))
            .collect();
        assert_eq!(ours[0].size_bytes, 4);
        assert_eq!(ours[1].size_bytes, 8);
        assert_eq!(ours[3].size_bytes, 2);
        assert_eq!(ours[5].size_bytes, 2);
        match compiler_offsets(&wanted) {
            Some(theirs) => {
                let ours: Vec<u32> = ours.iter().map(|m| m.offset_bytes).collect();
                eprintln!("offsets {wanted:?}: ours {ours:?}, cc {theirs:?}");
                assert_eq!(ours, theirs);
            }
            None => eprintln!("bpftool or cc missing: compared sizes only"),
        }
    }

    /// offsetof() of each member per the C compiler, from a vmlinux.h made
    /// by bpftool. `None` if a tool is missing.
    fn compiler_offsets(wanted: &[(&str, &str)]) -> Option<Vec<u32>> {
        use std::process::Command;
        let dir = std::env::temp_dir().join(format!("shaper-btf-test-{}", std::process::id()));
        fs::create_dir_all(&dir).ok()?;
        let header = Command::new("bpftool")
            .args(["btf", "dump", "file", VMLINUX_BTF, "format", "c"])
            .output()
            .ok()
            .filter(|o| o.status.success())?;
        fs::write(dir.join("vmlinux.h"), header.stdout).ok()?;
        let mut src = String::from(
            "#define BPF_NO_PRESERVE_ACCESS_INDEX\n#include \"vmlinux.h\"\n\
             extern int printf(const char *, ...);\nint main(void) {\n",
        );
        for (s, m) in wanted {
            src.push_str(&format!(
                "printf(\"%lu\\n\", (unsigned long)__builtin_offsetof(struct {s}, {m}));\n"
            ));
        }
        src.push_str("return 0; }\n");
        fs::write(dir.join("off.c"), src).ok()?;
        let exe = dir.join("off");
        let built = Command::new("cc")
            .arg("-w")
            .arg("-o")
            .arg(&exe)
            .arg(dir.join("off.c"))
            .status()
            .ok()?;
        if !built.success() {
            let _ = fs::remove_dir_all(&dir);
            return None;
        }
        let out = Command::new(&exe).output().ok()?;
        let _ = fs::remove_dir_all(&dir);
        String::from_utf8(out.stdout)
            .ok()?
            .lines()
            .map(|l| l.trim().parse().ok())
            .collect()
    }
}

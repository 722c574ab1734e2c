//! The recorded root tree of one interface, and its binary file format.
//!
//! A [`Snapshot`] holds every object of the egress tree as the kernel dumped
//! it, output-only attributes removed. It is written to disk while the shaper
//! runs, so a crashed shaper can be cleaned up by another process.
//!
//! # Format, version 1
//!
//! All integers little-endian. No padding between fields.
//!
//! ```text
//! header   magic "SHAPERTC" (8) | version u16 = 1 | flags u16 = 0 | ifindex u32 | records u32
//! record   tag u8 | 3 zero bytes | body
//!   tag 1 qdisc, 2 class, 3 chain, 4 filter:
//!          handle u32 | parent u32 | info u32 | attrs u32 | attrs × (type u16 | len u32 | bytes)
//!   tag 5 u32 root hash table of one filter:
//!          parent u32 | chain u32 | info u32 | root handle u32
//! ```
//!
//! Decoding rejects a wrong magic, an unknown version or flag, truncation,
//! trailing bytes, unknown tags, objects other than chains without a
//! `TCA_KIND` string, and qdiscs without exactly one root (no qdisc at all is
//! valid: a device that has never been up lists none).

use super::message::{Attr, Handle, TC_H_ROOT, TCA_CHAIN, TCA_KIND, TCA_OPTIONS, find};
use super::{TcError, filters};

const MAGIC: &[u8; 8] = b"SHAPERTC";
const VERSION: u16 = 1;
const TAG_QDISC: u8 = 1;
const TAG_CLASS: u8 = 2;
const TAG_CHAIN: u8 = 3;
const TAG_FILTER: u8 = 4;
const TAG_U32_ROOT: u8 = 5;
/// The smallest record: tag word plus four `u32`.
const MIN_RECORD: usize = 20;
/// The smallest attribute: type and length.
const MIN_ATTR: usize = 6;

/// One qdisc, class, chain or filter as dumped: the `tcmsg` fields that
/// identify it and its top-level attributes, raw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TcObject {
    /// `tcm_handle`: qdisc handle `maj:0`, class id `maj:min`, filter handle.
    pub handle: u32,
    /// `tcm_parent`: `TC_H_ROOT`, a class id, or for filters and chains the
    /// qdisc or class they are attached to.
    pub parent: u32,
    /// `tcm_info`: for filters `prio << 16 | protocol` (protocol in network
    /// byte order); zero for the others (their `tcm_info` is output-only).
    pub info: u32,
    /// Top-level attributes in dump order, output-only ones removed.
    pub attrs: Vec<Attr>,
}

impl TcObject {
    /// `TCA_KIND`, e.g. "htb"; empty if missing (never after `decode`).
    pub fn kind(&self) -> &str {
        find(&self.attrs, TCA_KIND)
            .and_then(Attr::as_str)
            .unwrap_or("")
    }

    /// `TCA_OPTIONS`, if present.
    pub fn options(&self) -> Option<&Attr> {
        find(&self.attrs, TCA_OPTIONS)
    }

    /// `TCA_CHAIN` of a filter or chain; 0 (the default chain) if absent.
    pub fn chain(&self) -> u32 {
        find(&self.attrs, TCA_CHAIN)
            .and_then(Attr::as_u32)
            .unwrap_or(0)
    }

    /// Filter priority ("pref"), from `tcm_info`.
    pub fn prio(&self) -> u32 {
        self.info >> 16
    }
}

/// The u32 classifier's root hash table of one filter (`tp->root`): the
/// kernel numbers it itself and the dump does not say which filter owns
/// which table, so the snapshot asks (see `u32_get` in net/sched/cls_u32.c).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct U32Root {
    pub parent: u32,
    pub chain: u32,
    pub info: u32,
    pub handle: u32,
}

/// The egress tree of one interface.
///
/// Contract: the root (parent `TC_H_ROOT`) comes first in `qdiscs`; a root with
/// handle 0 is the kernel's default, and no qdisc at all means the device
/// has never been up. Objects keep kernel dump order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    pub ifindex: u32,
    /// Root first, then the child qdiscs (those with handle 0 are defaults
    /// the kernel creates by itself, e.g. mq's per-queue pfifo_fast).
    pub qdiscs: Vec<TcObject>,
    pub classes: Vec<TcObject>,
    /// Every filter chain of every parent, in the kernel's (creation) order.
    pub chains: Vec<TcObject>,
    /// Filters per parent, each filter's header entry (handle 0) first.
    pub filters: Vec<TcObject>,
    pub u32_roots: Vec<U32Root>,
}

impl Snapshot {
    /// The root qdisc.
    pub fn root(&self) -> Option<&TcObject> {
        self.qdiscs.iter().find(|q| q.parent == TC_H_ROOT)
    }

    /// True if the root is the kernel's default (handle 0), or there is
    /// none (a device that has never been up lists no qdisc at all).
    pub fn has_default_root(&self) -> bool {
        self.root().is_none_or(|r| r.handle == 0)
    }

    /// A one-line summary, e.g. "root htb 1: with 4 classes, 2 child
    /// qdiscs, 3 filters".
    pub fn describe(&self) -> String {
        let Some(root) = self.root() else {
            return "no root qdisc (the device has never been up)".into();
        };
        let default = if root.handle == 0 { "default " } else { "" };
        let mut parts = Vec::new();
        let children = self.qdiscs.len().saturating_sub(1);
        let counts = [
            (self.classes.len(), "class", "classes"),
            (children, "child qdisc", "child qdiscs"),
            (self.filter_count(), "filter", "filters"),
        ];
        for (n, one, many) in counts {
            match n {
                0 => {}
                1 => parts.push(format!("1 {one}")),
                n => parts.push(format!("{n} {many}")),
            }
        }
        let kind = root.kind();
        let handle = Handle(root.handle);
        if parts.is_empty() {
            format!("{default}root {kind} {handle}")
        } else {
            format!("{default}root {kind} {handle} with {}", parts.join(", "))
        }
    }

    /// Filters as a user counts them: elements with a handle, u32 hash
    /// tables excluded and u32 entries listed under several parents of one
    /// qdisc counted once.
    fn filter_count(&self) -> usize {
        let mut seen = std::collections::BTreeSet::new();
        for f in self.filters.iter().filter(|f| f.handle != 0) {
            if f.kind() == "u32" {
                if !filters::is_u32_table(f.handle) {
                    seen.insert((f.parent >> 16, 0, f.handle, true));
                }
            } else {
                seen.insert((f.parent, f.info, f.handle, false));
            }
        }
        seen.len()
    }

    /// Serialises to the documented format.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(256);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
        out.extend_from_slice(&self.ifindex.to_le_bytes());
        let records = self.qdiscs.len()
            + self.classes.len()
            + self.chains.len()
            + self.filters.len()
            + self.u32_roots.len();
        put_u32(&mut out, records);
        for (tag, list) in [
            (TAG_QDISC, &self.qdiscs),
            (TAG_CLASS, &self.classes),
            (TAG_CHAIN, &self.chains),
            (TAG_FILTER, &self.filters),
        ] {
            for o in list {
                out.extend_from_slice(&[tag, 0, 0, 0]);
                for v in [o.handle, o.parent, o.info] {
                    out.extend_from_slice(&v.to_le_bytes());
                }
                put_u32(&mut out, o.attrs.len());
                for a in &o.attrs {
                    out.extend_from_slice(&a.ty.to_le_bytes());
                    put_u32(&mut out, a.value.len());
                    out.extend_from_slice(&a.value);
                }
            }
        }
        for r in &self.u32_roots {
            out.extend_from_slice(&[TAG_U32_ROOT, 0, 0, 0]);
            for v in [r.parent, r.chain, r.info, r.handle] {
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
        out
    }

    /// Parses the documented format; see the module docs for what is
    /// rejected. Never panics on any input.
    pub fn decode(bytes: &[u8]) -> Result<Snapshot, TcError> {
        let mut r = Reader { buf: bytes, pos: 0 };
        if r.take(8)? != MAGIC {
            return Err(bad("wrong magic: not a shaper tc snapshot"));
        }
        let version = r.u16()?;
        if version != VERSION {
            return Err(bad(&format!(
                "format version {version}, this shaper reads version {VERSION}"
            )));
        }
        if r.u16()? != 0 {
            return Err(bad("unknown flags set"));
        }
        let ifindex = r.u32()?;
        let records = r.count(MIN_RECORD)?;
        let mut s = Snapshot {
            ifindex,
            qdiscs: vec![],
            classes: vec![],
            chains: vec![],
            filters: vec![],
            u32_roots: vec![],
        };
        for _ in 0..records {
            let tag = r.take(4)?[0];
            if tag == TAG_U32_ROOT {
                let (parent, chain, info, handle) = (r.u32()?, r.u32()?, r.u32()?, r.u32()?);
                s.u32_roots.push(U32Root {
                    parent,
                    chain,
                    info,
                    handle,
                });
                continue;
            }
            let (handle, parent, info) = (r.u32()?, r.u32()?, r.u32()?);
            let n = r.count(MIN_ATTR)?;
            let mut attrs = Vec::with_capacity(n);
            for _ in 0..n {
                let ty = r.u16()?;
                let len = r.u32()? as usize;
                attrs.push(Attr {
                    ty,
                    value: r.take(len)?.to_vec(),
                });
            }
            let o = TcObject {
                handle,
                parent,
                info,
                attrs,
            };
            // A chain without a template has no kind; everything else does.
            if o.kind().is_empty() && tag != TAG_CHAIN {
                return Err(bad(&format!("object {} has no kind", Handle(handle))));
            }
            match tag {
                TAG_QDISC => s.qdiscs.push(o),
                TAG_CLASS => s.classes.push(o),
                TAG_CHAIN => s.chains.push(o),
                TAG_FILTER => s.filters.push(o),
                t => return Err(bad(&format!("unknown record tag {t}"))),
            }
        }
        if r.pos != bytes.len() {
            return Err(bad(&format!("{} trailing bytes", bytes.len() - r.pos)));
        }
        // No qdisc at all is valid: a device that has never been up.
        let roots = s.qdiscs.iter().filter(|q| q.parent == TC_H_ROOT).count();
        if roots > 1 || (roots == 0 && !s.qdiscs.is_empty()) {
            return Err(bad(&format!(
                "{roots} root qdiscs among {} qdiscs, expected one",
                s.qdiscs.len()
            )));
        }
        Ok(s)
    }
}

fn put_u32(out: &mut Vec<u8>, n: usize) {
    // Counts and lengths of dumped objects are far below 4 GiB.
    out.extend_from_slice(&u32::try_from(n).unwrap_or(u32::MAX).to_le_bytes());
}

fn bad(reason: &str) -> TcError {
    TcError::BadSnapshot {
        reason: reason.to_owned(),
    }
}

/// A bounds-checked cursor over the input.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], TcError> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len());
        let end =
            end.ok_or_else(|| bad(&format!("truncated at byte {} (wanted {n} more)", self.pos)))?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn u16(&mut self) -> Result<u16, TcError> {
        let b = self.take(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    fn u32(&mut self) -> Result<u32, TcError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// A count of items at least `min_size` bytes each; bounded by the
    /// remaining input so garbage cannot make us allocate gigabytes.
    fn count(&mut self, min_size: usize) -> Result<usize, TcError> {
        let n = self.u32()? as usize;
        if n > (self.buf.len() - self.pos) / min_size {
            return Err(bad(&format!(
                "count {n} at byte {} exceeds the remaining input",
                self.pos - 4
            )));
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(handle: u32, parent: u32, kind: &str) -> TcObject {
        TcObject {
            handle,
            parent,
            info: 0,
            attrs: vec![
                Attr::string(TCA_KIND, kind),
                Attr::bytes(TCA_OPTIONS | 0x8000, &[1, 2, 3, 4, 5]),
            ],
        }
    }

    fn sample() -> Snapshot {
        let mut f = obj(0x8000_0800, 0x10000, "u32");
        f.info = (1 << 16) | u32::from(0x0800u16.to_be());
        Snapshot {
            ifindex: 7,
            qdiscs: vec![
                obj(0x10000, TC_H_ROOT, "htb"),
                obj(0x100000, 0x10010, "tbf"),
            ],
            classes: vec![obj(0x10001, TC_H_ROOT, "htb"), obj(0x10010, 0x10001, "htb")],
            chains: vec![],
            filters: vec![f],
            u32_roots: vec![U32Root {
                parent: 0x10000,
                chain: 0,
                info: 1 << 16,
                handle: 0x8000_0000,
            }],
        }
    }

    #[test]
    fn encode_decode_round_trip() {
        let s = sample();
        let bytes = s.encode();
        assert_eq!(&bytes[..8], MAGIC);
        assert_eq!(Snapshot::decode(&bytes).expect("must succeed"), s);
        assert_eq!(
            s.describe(),
            "root htb 1: with 2 classes, 1 child qdisc, 1 filter"
        );
    }

    #[test]
    fn decode_rejects_every_truncation() {
        let bytes = sample().encode();
        for len in 0..bytes.len() {
            assert!(
                Snapshot::decode(&bytes[..len]).is_err(),
                "accepted a prefix of {len} bytes"
            );
        }
    }

    #[test]
    fn decode_rejects_garbage_magic_version_and_trailing_bytes() {
        let bytes = sample().encode();
        let mut wrong_magic = bytes.clone();
        wrong_magic[0] ^= 0xff;
        let mut wrong_version = bytes.clone();
        wrong_version[8] = 2;
        let mut trailing = bytes.clone();
        trailing.push(0);
        let mut huge_count = bytes.clone();
        huge_count[16..20].copy_from_slice(&u32::MAX.to_le_bytes());
        for (name, b) in [
            ("magic", wrong_magic),
            ("version", wrong_version),
            ("trailing", trailing),
            ("count", huge_count),
        ] {
            let e = Snapshot::decode(&b).expect_err("must fail");
            assert!(matches!(e, TcError::BadSnapshot { .. }), "{name}: {e}");
        }
        assert!(Snapshot::decode(b"garbage that is long enough to have a header").is_err());
        let e = Snapshot::decode(&[0xa5; 64]).expect_err("must fail");
        assert!(e.to_string().contains("wrong magic"), "{e}");
    }

    #[test]
    fn decode_rejects_kindless_objects_and_missing_root() {
        let mut s = sample();
        s.qdiscs[1].attrs.clear();
        assert!(Snapshot::decode(&s.encode()).is_err());
        let mut s = sample();
        s.qdiscs.remove(0);
        let e = Snapshot::decode(&s.encode()).expect_err("must fail");
        assert!(e.to_string().contains("0 root qdiscs among 1"), "{e}");
        let none = Snapshot {
            ifindex: 3,
            qdiscs: vec![],
            classes: vec![],
            chains: vec![],
            filters: vec![],
            u32_roots: vec![],
        };
        assert_eq!(
            Snapshot::decode(&none.encode()).expect("no qdisc is valid"),
            none
        );
        assert!(none.has_default_root());
    }

    #[test]
    fn describe_default_root() {
        let s = Snapshot {
            ifindex: 1,
            qdiscs: vec![obj(0, TC_H_ROOT, "noqueue")],
            classes: vec![],
            chains: vec![],
            filters: vec![],
            u32_roots: vec![],
        };
        assert_eq!(s.describe(), "default root noqueue 0:");
        assert!(s.has_default_root());
    }
}

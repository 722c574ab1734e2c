//! The wire format of traffic-control messages: the `tcmsg` header and the
//! 4-byte aligned `rtattr` list behind it.
//!
//! Invariants: every encoder here produces what the kernel's `nlmsg_parse`
//! accepts (lengths include the 4-byte attribute header, payloads are padded
//! to 4 bytes with zeros, padding is not counted in `rta_len`); every decoder
//! rejects truncation instead of guessing. Integers are host byte order, as
//! rtnetlink wants (`include/uapi/linux/rtnetlink.h`).
//!
//! Non-goals: interpreting attribute payloads. Attributes stay opaque bytes,
//! so a message dumped by the kernel can be sent back unchanged.

use std::fmt;

/// `RTM_*` message types from `include/uapi/linux/rtnetlink.h`.
pub(crate) const RTM_NEWQDISC: u16 = 36;
pub(crate) const RTM_DELQDISC: u16 = 37;
pub(crate) const RTM_GETQDISC: u16 = 38;
pub(crate) const RTM_NEWTCLASS: u16 = 40;
pub(crate) const RTM_GETTCLASS: u16 = 42;
pub(crate) const RTM_NEWTFILTER: u16 = 44;
pub(crate) const RTM_DELTFILTER: u16 = 45;
pub(crate) const RTM_GETTFILTER: u16 = 46;
pub(crate) const RTM_NEWCHAIN: u16 = 100;
pub(crate) const RTM_GETCHAIN: u16 = 102;

/// `TCA_*` top-level attributes of a `tcmsg` (`enum` in rtnetlink.h).
pub const TCA_KIND: u16 = 1;
/// Kind-specific options; opaque to this module.
pub const TCA_OPTIONS: u16 = 2;
pub(crate) const TCA_STATS: u16 = 3;
pub(crate) const TCA_XSTATS: u16 = 4;
pub(crate) const TCA_FCNT: u16 = 6;
pub(crate) const TCA_STATS2: u16 = 7;
pub(crate) const TCA_STAB: u16 = 8;
pub(crate) const TCA_PAD: u16 = 9;
pub(crate) const TCA_DUMP_INVISIBLE: u16 = 10;
pub(crate) const TCA_CHAIN: u16 = 11;
pub(crate) const TCA_HW_OFFLOAD: u16 = 12;
pub(crate) const TCA_DUMP_FLAGS: u16 = 15;
pub(crate) const TCA_EXT_WARN_MSG: u16 = 16;

/// Attributes the kernel only ever sends (statistics, counters, padding,
/// offload state, warnings) or only ever receives in a dump request. They are
/// dropped from snapshots; replaying them would at best be ignored.
/// `TCA_STATS`/`TCA_XSTATS`/`TCA_STATS2`: `tc_fill_qdisc`, `tc_fill_tclass`
/// in net/sched/sch_api.c; `TCA_FCNT`: obsolete filter count; `TCA_PAD`:
/// 64-bit alignment padding; `TCA_HW_OFFLOAD`: `tc_fill_qdisc` reports
/// whether the qdisc is offloaded; `TCA_EXT_WARN_MSG`: `tcf_fill_node` and
/// `tc_fill_qdisc` warnings; `TCA_DUMP_INVISIBLE`/`TCA_DUMP_FLAGS`: request
/// flags of dumps.
pub(crate) const OUTPUT_ONLY: [u16; 9] = [
    TCA_STATS,
    TCA_XSTATS,
    TCA_FCNT,
    TCA_STATS2,
    TCA_PAD,
    TCA_DUMP_INVISIBLE,
    TCA_HW_OFFLOAD,
    TCA_DUMP_FLAGS,
    TCA_EXT_WARN_MSG,
];

/// Flag bits of `rta_type` (`NLA_F_NESTED`, `NLA_F_NET_BYTEORDER`) that are
/// not part of the attribute number.
const NLA_TYPE_MASK: u16 = 0x3fff;
const NLA_F_NESTED: u16 = 0x8000;

/// `TC_H_ROOT`: the parent of a device's root (egress) qdisc.
pub const TC_H_ROOT: u32 = 0xffff_ffff;
/// `TC_H_INGRESS` (= `TC_H_CLSACT`): the parent of ingress and clsact.
pub const TC_H_INGRESS: u32 = 0xffff_fff1;

/// Size of `struct tcmsg`.
pub(crate) const TCMSG_LEN: usize = 20;

/// One netlink attribute: its type (flag bits included, as received) and
/// its payload without padding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attr {
    /// `rta_type`, including `NLA_F_NESTED` if the sender set it.
    pub ty: u16,
    /// The payload, exactly `rta_len - 4` bytes.
    pub value: Vec<u8>,
}

impl Attr {
    /// An attribute with an opaque payload.
    pub fn bytes(ty: u16, value: &[u8]) -> Self {
        Self {
            ty,
            value: value.to_vec(),
        }
    }

    /// A `u8` attribute.
    pub fn u8(ty: u16, value: u8) -> Self {
        Self {
            ty,
            value: vec![value],
        }
    }

    /// A `u32` attribute in host byte order.
    pub fn u32(ty: u16, value: u32) -> Self {
        Self {
            ty,
            value: value.to_ne_bytes().to_vec(),
        }
    }

    /// A NUL-terminated string attribute (`NLA_STRING`/`NLA_NUL_STRING`).
    pub fn string(ty: u16, value: &str) -> Self {
        let mut v = value.as_bytes().to_vec();
        v.push(0);
        Self { ty, value: v }
    }

    /// A nested attribute holding `children`, flagged `NLA_F_NESTED` as the
    /// kernel's own `nla_nest_start` does.
    pub fn nested(ty: u16, children: &[Attr]) -> Self {
        Self {
            ty: ty | NLA_F_NESTED,
            value: encode_attrs(children),
        }
    }

    /// The attribute number without flag bits.
    pub fn number(&self) -> u16 {
        self.ty & NLA_TYPE_MASK
    }

    /// The payload as a `u32`, if it is exactly 4 bytes.
    pub fn as_u32(&self) -> Option<u32> {
        let b: [u8; 4] = self.value.as_slice().try_into().ok()?;
        Some(u32::from_ne_bytes(b))
    }

    /// The payload as a string, without the trailing NUL(s).
    pub fn as_str(&self) -> Option<&str> {
        let end = self
            .value
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(self.value.len());
        std::str::from_utf8(&self.value[..end]).ok()
    }
}

/// Rounds `len` up to the 4-byte netlink alignment (`NLA_ALIGN`).
pub(crate) const fn align4(len: usize) -> usize {
    (len + 3) & !3
}

/// Appends `attrs` to `out` in wire format (header, payload, zero padding).
pub(crate) fn put_attrs(out: &mut Vec<u8>, attrs: &[Attr]) {
    for a in attrs {
        let len = 4 + a.value.len();
        // A payload over 64 KiB cannot be expressed in rta_len; the kernel
        // would reject the message anyway. Callers only pass dumped or small
        // attributes, so saturate rather than panic.
        let wire_len = u16::try_from(len).unwrap_or(u16::MAX);
        out.extend_from_slice(&wire_len.to_ne_bytes());
        out.extend_from_slice(&a.ty.to_ne_bytes());
        out.extend_from_slice(&a.value);
        out.resize(out.len() + (align4(len) - len), 0);
    }
}

/// Encodes `attrs` as the payload of a nested attribute, e.g. the contents
/// of `TCA_OPTIONS` for a qdisc whose options are attributes (fq, htb).
pub fn encode_attrs(attrs: &[Attr]) -> Vec<u8> {
    let mut out = Vec::new();
    put_attrs(&mut out, attrs);
    out
}

/// Parses a wire-format attribute list. Errors name the offset of the bad
/// attribute. A trailing fragment shorter than a header is an error too.
pub(crate) fn parse_attrs(mut buf: &[u8]) -> Result<Vec<Attr>, String> {
    let mut attrs = Vec::new();
    let mut offset = 0;
    while !buf.is_empty() {
        if buf.len() < 4 {
            return Err(format!("{} stray bytes at offset {offset}", buf.len()));
        }
        let len = usize::from(u16::from_ne_bytes([buf[0], buf[1]]));
        let ty = u16::from_ne_bytes([buf[2], buf[3]]);
        if len < 4 || len > buf.len() {
            return Err(format!(
                "attribute {ty} at offset {offset} has length {len}"
            ));
        }
        attrs.push(Attr {
            ty,
            value: buf[4..len].to_vec(),
        });
        let step = align4(len).min(buf.len());
        buf = &buf[step..];
        offset += step;
    }
    Ok(attrs)
}

/// The fixed `struct tcmsg` header of every qdisc, class, filter and chain
/// message. `family` and the padding are always zero for tc.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct TcMsg {
    pub ifindex: u32,
    pub handle: u32,
    pub parent: u32,
    /// Filters: `TC_H_MAKE(prio << 16, protocol)`, protocol in network
    /// byte order. Classes: the leaf qdisc handle (output only). Qdiscs:
    /// the reference count (output only).
    pub info: u32,
}

impl TcMsg {
    /// Appends the header in wire format.
    pub fn put(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&[0, 0, 0, 0]); // family, pad1, pad2
        out.extend_from_slice(&self.ifindex.to_ne_bytes());
        out.extend_from_slice(&self.handle.to_ne_bytes());
        out.extend_from_slice(&self.parent.to_ne_bytes());
        out.extend_from_slice(&self.info.to_ne_bytes());
    }
}

/// A decoded tc message: header plus all top-level attributes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TcMessage {
    pub header: TcMsg,
    pub attrs: Vec<Attr>,
}

impl TcMessage {
    /// Builds a request body: header, then `attrs`.
    pub fn encode(header: TcMsg, attrs: &[Attr]) -> Vec<u8> {
        let mut out = Vec::with_capacity(TCMSG_LEN + 64);
        header.put(&mut out);
        put_attrs(&mut out, attrs);
        out
    }

    /// Parses a message body (after the `nlmsghdr`).
    pub fn decode(body: &[u8]) -> Result<Self, String> {
        if body.len() < TCMSG_LEN {
            return Err(format!("tcmsg of {} bytes, need {TCMSG_LEN}", body.len()));
        }
        let word = |i: usize| u32::from_ne_bytes([body[i], body[i + 1], body[i + 2], body[i + 3]]);
        let header = TcMsg {
            ifindex: word(4),
            handle: word(8),
            parent: word(12),
            info: word(16),
        };
        let attrs = parse_attrs(&body[TCMSG_LEN..])?;
        Ok(Self { header, attrs })
    }
}

/// The first attribute numbered `number` (flag bits ignored).
pub(crate) fn find(attrs: &[Attr], number: u16) -> Option<&Attr> {
    attrs.iter().find(|a| a.number() == number)
}

/// A qdisc or class handle as `tc` prints it: `1:`, `1:10`, `:1`, `root`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Handle(pub u32);

impl fmt::Display for Handle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            TC_H_ROOT => write!(f, "root"),
            TC_H_INGRESS => write!(f, "ingress"),
            h if h & 0xffff == 0 => write!(f, "{:x}:", h >> 16),
            h if h >> 16 == 0 => write!(f, ":{:x}", h & 0xffff),
            h => write!(f, "{:x}:{:x}", h >> 16, h & 0xffff),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attrs_round_trip_with_padding() {
        let attrs = vec![
            Attr::string(TCA_KIND, "htb"),
            Attr::u8(5, 1),
            Attr::nested(TCA_OPTIONS, &[Attr::u32(1, 7), Attr::bytes(2, &[])]),
        ];
        let wire = encode_attrs(&attrs);
        assert_eq!(wire.len() % 4, 0);
        assert_eq!(parse_attrs(&wire).expect("must succeed"), attrs);
        let nested = parse_attrs(&attrs[2].value).expect("must succeed");
        assert_eq!(nested[0].as_u32(), Some(7));
        assert_eq!(attrs[2].number(), TCA_OPTIONS);
        assert_eq!(attrs[0].as_str(), Some("htb"));
    }

    #[test]
    fn parse_rejects_truncation() {
        let wire = encode_attrs(&[Attr::u32(1, 7)]);
        assert!(parse_attrs(&wire[..6]).is_err());
        assert!(parse_attrs(&wire[..3]).is_err());
        let mut bad = wire.clone();
        bad[0] = 2; // rta_len below the header size
        assert!(parse_attrs(&bad).is_err());
    }

    #[test]
    fn tcmsg_round_trip() {
        let h = TcMsg {
            ifindex: 7,
            handle: 0x10000,
            parent: TC_H_ROOT,
            info: 0x10_0008,
        };
        let body = TcMessage::encode(h, &[Attr::string(TCA_KIND, "tbf")]);
        let m = TcMessage::decode(&body).expect("must succeed");
        assert_eq!(m.header, h);
        assert_eq!(find(&m.attrs, TCA_KIND).and_then(Attr::as_str), Some("tbf"));
        assert!(TcMessage::decode(&body[..19]).is_err());
    }

    #[test]
    fn handles_print_like_tc() {
        assert_eq!(Handle(0x10000).to_string(), "1:");
        assert_eq!(Handle(0x10010).to_string(), "1:10");
        assert_eq!(Handle(3).to_string(), ":3");
        assert_eq!(Handle(0).to_string(), "0:");
        assert_eq!(Handle(TC_H_ROOT).to_string(), "root");
    }
}

/// The parsers behind the qdisc snapshot under arbitrary bytes: no panic,
/// nothing allocated beyond the input, errors that say where, and what
/// parses encodes back to itself.
#[cfg(test)]
mod parser_properties {
    use proptest::prelude::*;

    use super::*;
    use crate::tc::Snapshot;

    proptest! {
        #[test]
        fn attribute_lists_never_panic_or_grow(buf in proptest::collection::vec(any::<u8>(), 0..512)) {
            match parse_attrs(&buf) {
                Ok(attrs) => {
                    let held: usize = attrs.iter().map(|a| a.value.len() + 4).sum();
                    prop_assert!(held <= buf.len(), "{held} bytes held from {}", buf.len());
                    let again = parse_attrs(&encode_attrs(&attrs)).expect("our own encoding");
                    prop_assert_eq!(again, attrs);
                }
                Err(e) => prop_assert!(e.contains("offset"), "{e}"),
            }
        }

        #[test]
        fn tc_messages_never_panic(buf in proptest::collection::vec(any::<u8>(), 0..256)) {
            if let Err(e) = TcMessage::decode(&buf) {
                prop_assert!(e.contains("offset") || e.contains("tcmsg"), "{e}");
            }
        }

        #[test]
        fn snapshots_never_panic(buf in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = Snapshot::decode(&buf);
        }
    }
}

//! Offloaded conntrack entries, read through ctnetlink, and whether the
//! shaper's flow table holds them.
//!
//! Request: one `IPCTNL_MSG_CT_GET` dump (`NFNL_SUBSYS_CTNETLINK << 8 | 1`,
//! `NLM_F_DUMP`) on a NETLINK_NETFILTER socket, body `struct nfgenmsg` with
//! family `AF_UNSPEC` (every family), version `NFNETLINK_V0`, res_id 0.
//! Replies: `IPCTNL_MSG_CT_NEW` messages, `nfgenmsg` then attributes
//! (include/uapi/linux/netfilter/nfnetlink_conntrack.h). ctnetlink sends
//! numbers in network byte order; nested attributes carry `NLA_F_NESTED`.
//! An entry is offloaded when its `CTA_STATUS` has `IPS_OFFLOAD` (bit 14,
//! software flowtable) or `IPS_HW_OFFLOAD` (bit 15, in hardware)
//! (include/uapi/linux/netfilter/nf_conntrack_common.h).
//!
//! Counters (`CTA_COUNTERS_ORIG/REPLY`) are only present with
//! `net.netfilter.nf_conntrack_acct=1`; absent means unknown, not zero. For a
//! flow in the software flowtable they include what the flowtable forwarded
//! only if the flowtable has the `counter` flag (`NF_FLOWTABLE_COUNTER`);
//! without it they stop at the packets seen before the offload (measured on
//! 6.12: 2 packets, 112 bytes for an iperf3 flow of tens of megabytes).
//!
//! Not available (no error): when `/proc/sys/net/netfilter/nf_conntrack_max`
//! is missing (nf_conntrack not loaded, so nothing is checked and no module
//! is loaded on our account), the socket family is missing
//! (`EPROTONOSUPPORT`), or the subsystem is (`EOPNOTSUPP`, `ENOENT`).
//!
//! The crate netlink-packet-netfilter (0.4) was considered: it parses
//! conntrack tuples and status but leaves `CTA_COUNTERS_*` as raw
//! attributes and brings no socket; the walk here is short, over the
//! attribute parser and the netlink socket the tc code already has
//! ([`crate::tc::message`], [`crate::tc::netlink`]).

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    path::Path,
};

use aya::maps::Array;
use netlink_sys::protocols::NETLINK_NETFILTER;
use serde_json::{Value, json};
use shaper_common::{
    config::{FLAG_FAIR, PacerConfig},
    flow::{FlowHasher, FlowSet, set_and_tag},
};

use super::ObserveError;
use crate::{
    pins,
    tc::{
        message::{Attr, parse_attrs},
        netlink::Netlink,
    },
};

const NFNL_SUBSYS_CTNETLINK: u16 = 1;
const IPCTNL_MSG_CT_NEW: u16 = 0;
const IPCTNL_MSG_CT_GET: u16 = 1;

const CTA_TUPLE_ORIG: u16 = 1;
const CTA_TUPLE_REPLY: u16 = 2;
const CTA_STATUS: u16 = 3;
const CTA_COUNTERS_ORIG: u16 = 9;
const CTA_COUNTERS_REPLY: u16 = 10;

const CTA_TUPLE_IP: u16 = 1;
const CTA_TUPLE_PROTO: u16 = 2;

const CTA_IP_V4_SRC: u16 = 1;
const CTA_IP_V4_DST: u16 = 2;
const CTA_IP_V6_SRC: u16 = 3;
const CTA_IP_V6_DST: u16 = 4;

const CTA_PROTO_NUM: u16 = 1;
const CTA_PROTO_SRC_PORT: u16 = 2;
const CTA_PROTO_DST_PORT: u16 = 3;

const CTA_COUNTERS_PACKETS: u16 = 1;
const CTA_COUNTERS_BYTES: u16 = 2;
const CTA_COUNTERS32_PACKETS: u16 = 3;
const CTA_COUNTERS32_BYTES: u16 = 4;

/// `IPS_OFFLOAD`: in the software flowtable.
pub const IPS_OFFLOAD: u32 = 1 << 14;
/// `IPS_HW_OFFLOAD`: offloaded to hardware.
pub const IPS_HW_OFFLOAD: u32 = 1 << 15;

const NFGENMSG_LEN: usize = 4;

/// One direction's addresses, protocol and ports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tuple {
    /// Source address.
    pub src: IpAddr,
    /// Destination address.
    pub dst: IpAddr,
    /// IP protocol number.
    pub proto: u8,
    /// Source port (TCP, UDP, SCTP, ...), if the entry has one.
    pub sport: Option<u16>,
    /// Destination port, if any.
    pub dport: Option<u16>,
}

impl Tuple {
    /// The same flow seen the other way.
    pub fn reversed(&self) -> Tuple {
        Tuple {
            src: self.dst,
            dst: self.src,
            proto: self.proto,
            sport: self.dport,
            dport: self.sport,
        }
    }
}

/// Packets and bytes of one direction, when conntrack accounting is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CtCounters {
    /// Packets.
    pub packets: u64,
    /// Bytes (IP length, as conntrack counts).
    pub bytes: u64,
}

/// One conntrack entry, as much as the observer uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CtEntry {
    /// The original direction.
    pub orig: Tuple,
    /// The reply direction, if present.
    pub reply: Option<Tuple>,
    /// `CTA_STATUS`.
    pub status: u32,
    /// Original-direction counters, if accounted.
    pub orig_counters: Option<CtCounters>,
    /// Reply-direction counters, if accounted.
    pub reply_counters: Option<CtCounters>,
}

impl CtEntry {
    /// "hardware", "software", or `None` when not offloaded.
    pub fn offload_kind(&self) -> Option<&'static str> {
        if self.status & IPS_HW_OFFLOAD != 0 {
            Some("hardware")
        } else if self.status & IPS_OFFLOAD != 0 {
            Some("software")
        } else {
            None
        }
    }
}

/// The result of looking for conntrack.
#[derive(Debug)]
pub enum Table {
    /// The entries (all of them, offloaded or not).
    Entries(Vec<CtEntry>),
    /// No conntrack here; why.
    Unavailable(String),
}

/// Dumps the conntrack table of the current network namespace.
pub fn dump() -> Result<Table, ObserveError> {
    dump_with(Path::new("/proc/sys/net/netfilter/nf_conntrack_max"))
}

fn dump_with(probe: &Path) -> Result<Table, ObserveError> {
    if !probe.exists() {
        return Ok(Table::Unavailable(
            "nf_conntrack is not loaded in this kernel".into(),
        ));
    }
    let unavailable = |errno: Option<i32>| {
        matches!(
            errno,
            Some(libc::EPROTONOSUPPORT | libc::EOPNOTSUPP | libc::ENOENT | libc::EAFNOSUPPORT)
        )
    };
    let mut nl = match Netlink::open_protocol(NETLINK_NETFILTER) {
        Ok(nl) => nl,
        Err(e) if unavailable(e.raw_os_error()) => {
            return Ok(Table::Unavailable(format!(
                "no NETLINK_NETFILTER socket: {e}"
            )));
        }
        Err(e) => {
            return Err(ObserveError::Conntrack {
                detail: format!("socket: {e}"),
            });
        }
    };
    let request = (NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_GET;
    let reply = (NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_NEW;
    // nfgenmsg: AF_UNSPEC, NFNETLINK_V0, res_id 0 (big-endian, so zero).
    let body = [0u8; NFGENMSG_LEN];
    match nl.dump(request, reply, &body) {
        Ok(bodies) => bodies
            .iter()
            .map(|b| parse_entry(b))
            .collect::<Result<Vec<_>, _>>()
            .map(Table::Entries)
            .map_err(|detail| ObserveError::Conntrack { detail }),
        Err(e) if unavailable(e.errno()) => Ok(Table::Unavailable(format!(
            "ctnetlink is not available: {}",
            e.source
        ))),
        Err(e) => Err(ObserveError::Conntrack {
            detail: format!("IPCTNL_MSG_CT_GET dump: {}", e.source),
        }),
    }
}

fn find(attrs: &[Attr], number: u16) -> Option<&Attr> {
    attrs.iter().find(|a| a.number() == number)
}

fn be16(a: &Attr) -> Option<u16> {
    Some(u16::from_be_bytes(a.value.as_slice().try_into().ok()?))
}

fn be32(a: &Attr) -> Option<u32> {
    Some(u32::from_be_bytes(a.value.as_slice().try_into().ok()?))
}

fn be64(a: &Attr) -> Option<u64> {
    Some(u64::from_be_bytes(a.value.as_slice().try_into().ok()?))
}

/// Parses one `IPCTNL_MSG_CT_NEW` body (after the `nlmsghdr`).
pub fn parse_entry(body: &[u8]) -> Result<CtEntry, String> {
    let attrs = parse_attrs(
        body.get(NFGENMSG_LEN..)
            .ok_or_else(|| format!("conntrack message of {} bytes", body.len()))?,
    )?;
    let orig = find(&attrs, CTA_TUPLE_ORIG)
        .ok_or("conntrack entry without CTA_TUPLE_ORIG")
        .map_err(String::from)
        .and_then(|a| parse_tuple(&a.value))?;
    let reply = find(&attrs, CTA_TUPLE_REPLY)
        .map(|a| parse_tuple(&a.value))
        .transpose()?;
    let status = find(&attrs, CTA_STATUS).and_then(be32).unwrap_or(0);
    let counters = |n| {
        find(&attrs, n)
            .map(|a| parse_counters(&a.value))
            .transpose()
            .map(Option::flatten)
    };
    Ok(CtEntry {
        orig,
        reply,
        status,
        orig_counters: counters(CTA_COUNTERS_ORIG)?,
        reply_counters: counters(CTA_COUNTERS_REPLY)?,
    })
}

fn parse_tuple(nested: &[u8]) -> Result<Tuple, String> {
    let attrs = parse_attrs(nested)?;
    let ip = parse_attrs(
        &find(&attrs, CTA_TUPLE_IP)
            .ok_or("tuple without CTA_TUPLE_IP")?
            .value,
    )?;
    let proto = parse_attrs(
        &find(&attrs, CTA_TUPLE_PROTO)
            .ok_or("tuple without CTA_TUPLE_PROTO")?
            .value,
    )?;
    let v4 = |n| -> Option<IpAddr> {
        let b: [u8; 4] = find(&ip, n)?.value.as_slice().try_into().ok()?;
        Some(IpAddr::V4(Ipv4Addr::from(b)))
    };
    let v6 = |n| -> Option<IpAddr> {
        let b: [u8; 16] = find(&ip, n)?.value.as_slice().try_into().ok()?;
        Some(IpAddr::V6(Ipv6Addr::from(b)))
    };
    let (src, dst) = match (v4(CTA_IP_V4_SRC), v4(CTA_IP_V4_DST)) {
        (Some(s), Some(d)) => (s, d),
        _ => match (v6(CTA_IP_V6_SRC), v6(CTA_IP_V6_DST)) {
            (Some(s), Some(d)) => (s, d),
            _ => return Err("tuple without a source and destination address".into()),
        },
    };
    let num = find(&proto, CTA_PROTO_NUM)
        .and_then(|a| a.value.first().copied())
        .ok_or("tuple without CTA_PROTO_NUM")?;
    Ok(Tuple {
        src,
        dst,
        proto: num,
        sport: find(&proto, CTA_PROTO_SRC_PORT).and_then(be16),
        dport: find(&proto, CTA_PROTO_DST_PORT).and_then(be16),
    })
}

fn parse_counters(nested: &[u8]) -> Result<Option<CtCounters>, String> {
    let attrs = parse_attrs(nested)?;
    let packets = find(&attrs, CTA_COUNTERS_PACKETS)
        .and_then(be64)
        .or_else(|| {
            find(&attrs, CTA_COUNTERS32_PACKETS)
                .and_then(be32)
                .map(u64::from)
        });
    let bytes = find(&attrs, CTA_COUNTERS_BYTES).and_then(be64).or_else(|| {
        find(&attrs, CTA_COUNTERS32_BYTES)
            .and_then(be32)
            .map(u64::from)
    });
    Ok(match (packets, bytes) {
        (Some(packets), Some(bytes)) => Some(CtCounters { packets, bytes }),
        _ => None,
    })
}

/// The hash the egress classifier computes for an untagged frame of this
/// tuple (see shaper-ebpf's `parse::classify`): ethertype, addresses (as the
/// 32-bit words the program loads), protocol, then for TCP and UDP the word
/// holding both ports. IPv6 extension headers and VLAN tags are assumed
/// absent.
pub fn flow_hash(t: &Tuple, seed: u64) -> u64 {
    let mut h = FlowHasher::new(seed);
    let words = |ip: &IpAddr| -> Vec<u32> {
        let octets = match ip {
            IpAddr::V4(a) => a.octets().to_vec(),
            IpAddr::V6(a) => a.octets().to_vec(),
        };
        octets
            .chunks_exact(4)
            .map(|c| u32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    };
    h.word(match t.src {
        IpAddr::V4(_) => 0x0800,
        IpAddr::V6(_) => 0x86dd,
    });
    for w in words(&t.src).into_iter().chain(words(&t.dst)) {
        h.word(w);
    }
    h.word(u32::from(t.proto));
    if let (6 | 17, Some(s), Some(d)) = (t.proto, t.sport, t.dport) {
        let [a, b] = s.to_be_bytes();
        let [c, e] = d.to_be_bytes();
        h.word(u32::from_ne_bytes([a, b, c, e]));
    }
    h.finish()
}

/// What matching an entry against the pacer's flow table found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Match {
    /// A way of the flow's set holds its tag (hash match: two flows share a
    /// set and tag with probability about 2^-32).
    InTable,
    /// The pacer runs, and no way holds the flow: it sent nothing through the
    /// pacer lately (its entry aged out, or it never passed it).
    NotInTable,
    /// Matching was not possible; why.
    Unknown(String),
}

impl Match {
    fn json(&self) -> (Value, Value) {
        match self {
            Match::InTable => (json!(true), Value::Null),
            Match::NotInTable => (json!(false), Value::Null),
            Match::Unknown(why) => (Value::Null, json!(why)),
        }
    }
}

/// The pacer's pinned flow table, read once, for matching.
pub struct ShaperTable {
    config: PacerConfig,
    flows: Array<aya::maps::MapData, FlowSet>,
}

/// Opens the pinned configuration and flow table in `pin_dir`, or says why
/// matching is impossible.
pub fn open_shaper_table(pin_dir: &Path) -> Result<ShaperTable, String> {
    let open = |file: &str| -> Result<aya::maps::Map, String> {
        let path = pin_dir.join(file);
        match pins::open(&path) {
            Ok(Some(m)) => Ok(m),
            Ok(None) => Err(format!(
                "no shaper pacer is attached to this interface ({} is absent)",
                path.display()
            )),
            Err(e) => Err(e.to_string()),
        }
    };
    let config_map: Array<_, PacerConfig> =
        Array::try_from(open(pins::CONFIG)?).map_err(|e| e.to_string())?;
    let config = config_map.get(&0, 0).map_err(|e| e.to_string())?;
    if config.flags & FLAG_FAIR == 0 {
        return Err("the pacer is the aggregate one, which keeps no per-flow table".into());
    }
    let flows = Array::try_from(open(pins::FLOWS)?).map_err(|e| e.to_string())?;
    Ok(ShaperTable { config, flows })
}

impl ShaperTable {
    /// Looks for any direction of `e` in the table.
    pub fn lookup(&self, e: &CtEntry) -> Match {
        let mut candidates = vec![e.orig, e.orig.reversed()];
        if let Some(r) = e.reply {
            candidates.push(r);
            candidates.push(r.reversed());
        }
        for t in &candidates {
            let (set, tag) = set_and_tag(
                flow_hash(t, self.config.hash_seed),
                self.config.flow_sets_mask,
            );
            match self.flows.get(&set, 0) {
                Ok(s) if s.ways.iter().any(|w| w.tag == tag) => return Match::InTable,
                Ok(_) => {}
                Err(err) => return Match::Unknown(format!("reading the flow table: {err}")),
            }
        }
        Match::NotInTable
    }
}

fn proto_name(p: u8) -> Value {
    match p {
        1 => json!("icmp"),
        6 => json!("tcp"),
        17 => json!("udp"),
        58 => json!("icmpv6"),
        132 => json!("sctp"),
        _ => Value::Null,
    }
}

/// The `{"kind":"offloaded_flow",...}` record.
pub fn flow_json(iface: &str, e: &CtEntry, m: &Match) -> Value {
    let c = |c: Option<CtCounters>| {
        (
            c.map_or(Value::Null, |c| json!(c.packets)),
            c.map_or(Value::Null, |c| json!(c.bytes)),
        )
    };
    let (op, ob) = c(e.orig_counters);
    let (rp, rb) = c(e.reply_counters);
    let (in_table, why) = m.json();
    json!({
        "kind": "offloaded_flow",
        "iface": iface,
        "offload": e.offload_kind(),
        "proto": proto_name(e.orig.proto),
        "proto_num": e.orig.proto,
        "src": e.orig.src.to_string(),
        "dst": e.orig.dst.to_string(),
        "sport": e.orig.sport,
        "dport": e.orig.dport,
        "orig_packets": op,
        "orig_bytes": ob,
        "reply_packets": rp,
        "reply_bytes": rb,
        "in_shaper_flow_table": in_table,
        "shaper_match_note": why,
    })
}

/// One text line for an offloaded flow.
pub fn flow_text(e: &CtEntry, m: &Match) -> String {
    let port = |p: Option<u16>| p.map(|p| format!(":{p}")).unwrap_or_default();
    let counters = |c: Option<CtCounters>| {
        c.map_or_else(
            || "unknown (nf_conntrack_acct off)".to_owned(),
            |c| format!("{} B/{} p", c.bytes, c.packets),
        )
    };
    let matched = match m {
        Match::InTable => "in the shaper's flow table".to_owned(),
        Match::NotInTable => "not in the shaper's flow table".to_owned(),
        Match::Unknown(why) => format!("shaper match unknown: {why}"),
    };
    format!(
        "offloaded ({}) proto {} {}{} -> {}{} orig {} reply {}; {}",
        e.offload_kind().unwrap_or("no"),
        e.orig.proto,
        e.orig.src,
        port(e.orig.sport),
        e.orig.dst,
        port(e.orig.dport),
        counters(e.orig_counters),
        counters(e.reply_counters),
        matched
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tc::message::encode_attrs;

    fn tuple_attr(ty: u16, src: [u8; 4], dst: [u8; 4], proto: u8, sp: u16, dp: u16) -> Attr {
        Attr::nested(
            ty,
            &[
                Attr::nested(
                    CTA_TUPLE_IP,
                    &[
                        Attr::bytes(CTA_IP_V4_SRC, &src),
                        Attr::bytes(CTA_IP_V4_DST, &dst),
                    ],
                ),
                Attr::nested(
                    CTA_TUPLE_PROTO,
                    &[
                        Attr::u8(CTA_PROTO_NUM, proto),
                        Attr::bytes(CTA_PROTO_SRC_PORT, &sp.to_be_bytes()),
                        Attr::bytes(CTA_PROTO_DST_PORT, &dp.to_be_bytes()),
                    ],
                ),
            ],
        )
    }

    /// A message body as the kernel builds it (ctnetlink_fill_info):
    /// nfgenmsg, tuples, status, counters.
    fn fixture(status: u32, with_counters: bool) -> Vec<u8> {
        let mut attrs = vec![
            tuple_attr(
                CTA_TUPLE_ORIG,
                [10, 0, 1, 2],
                [10, 0, 2, 2],
                6,
                40_000,
                5201,
            ),
            tuple_attr(
                CTA_TUPLE_REPLY,
                [10, 0, 2, 2],
                [10, 0, 1, 2],
                6,
                5201,
                40_000,
            ),
            Attr::bytes(CTA_STATUS, &status.to_be_bytes()),
        ];
        if with_counters {
            attrs.push(Attr::nested(
                CTA_COUNTERS_ORIG,
                &[
                    Attr::bytes(CTA_COUNTERS_PACKETS, &1234u64.to_be_bytes()),
                    Attr::bytes(CTA_COUNTERS_BYTES, &5_000_000u64.to_be_bytes()),
                ],
            ));
            attrs.push(Attr::nested(
                CTA_COUNTERS_REPLY,
                &[
                    Attr::bytes(CTA_COUNTERS32_PACKETS, &99u32.to_be_bytes()),
                    Attr::bytes(CTA_COUNTERS32_BYTES, &5_148u32.to_be_bytes()),
                ],
            ));
        }
        let mut body = vec![2u8, 0, 0, 0]; // AF_INET, NFNETLINK_V0, res_id 0
        body.extend_from_slice(&encode_attrs(&attrs));
        body
    }

    #[test]
    fn parses_an_offloaded_tcp_entry_with_counters() {
        // IPS_CONFIRMED | IPS_SEEN_REPLY | IPS_ASSURED | IPS_OFFLOAD.
        let status = (1 << 3) | (1 << 1) | (1 << 2) | IPS_OFFLOAD;
        let e = parse_entry(&fixture(status, true)).expect("parses");
        assert_eq!(e.orig.src, IpAddr::V4(Ipv4Addr::new(10, 0, 1, 2)));
        assert_eq!(e.orig.dst, IpAddr::V4(Ipv4Addr::new(10, 0, 2, 2)));
        assert_eq!(e.orig.proto, 6);
        assert_eq!(e.orig.sport, Some(40_000));
        assert_eq!(e.orig.dport, Some(5201));
        assert_eq!(e.reply, Some(e.orig.reversed()));
        assert_eq!(e.offload_kind(), Some("software"));
        assert_eq!(
            e.orig_counters,
            Some(CtCounters {
                packets: 1234,
                bytes: 5_000_000
            })
        );
        assert_eq!(
            e.reply_counters,
            Some(CtCounters {
                packets: 99,
                bytes: 5_148
            })
        );
        let v = flow_json("r1", &e, &Match::Unknown("no pacer".into()));
        assert_eq!(v["kind"], "offloaded_flow");
        assert_eq!(v["proto"], "tcp");
        assert_eq!(v["dport"], 5201);
        assert_eq!(v["orig_bytes"], 5_000_000);
        assert!(v["in_shaper_flow_table"].is_null());
    }

    #[test]
    fn hardware_offload_and_missing_counters() {
        let e = parse_entry(&fixture(IPS_OFFLOAD | IPS_HW_OFFLOAD, false)).expect("parses");
        assert_eq!(e.offload_kind(), Some("hardware"));
        assert_eq!(e.orig_counters, None);
        assert!(flow_text(&e, &Match::NotInTable).contains("unknown (nf_conntrack_acct off)"));
        let v = flow_json("r1", &e, &Match::NotInTable);
        assert!(v["orig_packets"].is_null());
        assert_eq!(v["in_shaper_flow_table"], false);
        let e = parse_entry(&fixture(1 << 3, false)).expect("parses");
        assert_eq!(e.offload_kind(), None);
    }

    #[test]
    fn rejects_truncated_and_tupleless_messages() {
        assert!(parse_entry(&[2, 0]).is_err());
        let mut body = fixture(IPS_OFFLOAD, false);
        body.truncate(body.len() - 2);
        assert!(parse_entry(&body).is_err());
        let mut only_status = vec![2u8, 0, 0, 0];
        only_status.extend_from_slice(&encode_attrs(&[Attr::bytes(
            CTA_STATUS,
            &IPS_OFFLOAD.to_be_bytes(),
        )]));
        assert!(parse_entry(&only_status).is_err());
    }

    #[test]
    fn missing_conntrack_is_unavailable_not_an_error() {
        match dump_with(Path::new("/nonexistent/nf_conntrack_max")) {
            Ok(Table::Unavailable(why)) => assert!(why.contains("not loaded"), "{why}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn flow_hash_matches_the_word_order_of_the_classifier() {
        // The same words fed by hand, in the order parse.rs feeds them.
        let t = Tuple {
            src: IpAddr::V4(Ipv4Addr::new(10, 0, 1, 2)),
            dst: IpAddr::V4(Ipv4Addr::new(10, 0, 2, 2)),
            proto: 6,
            sport: Some(40_000),
            dport: Some(5201),
        };
        let mut h = FlowHasher::new(7);
        h.word(0x0800);
        h.word(u32::from_ne_bytes([10, 0, 1, 2]));
        h.word(u32::from_ne_bytes([10, 0, 2, 2]));
        h.word(6);
        let [a, b] = 40_000u16.to_be_bytes();
        let [c, d] = 5201u16.to_be_bytes();
        h.word(u32::from_ne_bytes([a, b, c, d]));
        assert_eq!(flow_hash(&t, 7), h.finish());
        assert_ne!(flow_hash(&t, 7), flow_hash(&t.reversed(), 7));
    }
}

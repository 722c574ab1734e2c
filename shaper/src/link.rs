//! Interface facts the shaper needs before touching anything: does it exist,
//! is it up, does it carry a link-layer header, how many TX queues has it,
//! what are its MTU and GSO limits.
//!
//! One RTM_GETLINK request by name over rtnetlink (netlink-packet-route), in
//! the caller's network namespace. Read-only.

use std::io;

use netlink_packet_core::{NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload};
use netlink_packet_route::{
    RouteNetlinkMessage,
    link::{InfoKind, LinkAttribute, LinkFlags, LinkInfo, LinkLayerType, LinkMessage, State},
};
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE};

use crate::gso::GsoSizes;

/// What the shaper needs to know about an interface.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Link {
    /// Kernel interface index.
    pub ifindex: u32,
    /// Interface name.
    pub name: String,
    /// Administratively up (`IFF_UP`).
    pub admin_up: bool,
    /// Operational state as the kernel reports it (`up`, `down`, `unknown`...).
    pub oper_state: String,
    /// Frames start with an Ethernet header (false on PPP, WireGuard, tun).
    pub has_l2_header: bool,
    /// Number of TX queues (`>1` means multiqueue: mq root with fq leaves).
    pub tx_queues: u32,
    /// MTU in bytes.
    pub mtu_bytes: u32,
    /// GSO size limits, when the kernel reports `IFLA_GSO_MAX_SIZE`.
    pub gso: Option<GsoSizes>,
    /// An IFB device (`IFLA_INFO_KIND` "ifb").
    pub is_ifb: bool,
}

/// Failures looking an interface up.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    /// No interface of that name in this network namespace.
    #[error(
        "no interface named '{iface}' in this network namespace: check the name with `ip link` \
         (names are case-sensitive)"
    )]
    NotFound {
        /// The name asked for.
        iface: String,
    },
    /// Not a possible interface name.
    #[error("'{iface}' is not a valid interface name: 1 to 15 characters, no '/', ':' or spaces")]
    InvalidName {
        /// The name given.
        iface: String,
    },
    /// The netlink exchange itself failed.
    #[error("rtnetlink {op} failed")]
    Netlink {
        /// What was being done.
        op: &'static str,
        /// The cause.
        #[source]
        source: io::Error,
    },
}

/// True for a name the kernel could accept (`dev_valid_name` in net/core/dev.c).
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() < 16
        && name != "."
        && name != ".."
        && !name
            .bytes()
            .any(|b| b == b'/' || b == b':' || b.is_ascii_whitespace())
}

/// Looks `name` up. Errors with [`LinkError::NotFound`] if it does not exist.
pub fn link_by_name(name: &str) -> Result<Link, LinkError> {
    if !valid_name(name) {
        return Err(LinkError::InvalidName {
            iface: name.to_owned(),
        });
    }
    let nl = |op| move |source| LinkError::Netlink { op, source };
    let mut socket = Socket::new(NETLINK_ROUTE).map_err(nl("socket"))?;
    socket.bind_auto().map_err(nl("bind"))?;
    socket
        .connect(&SocketAddr::new(0, 0))
        .map_err(nl("connect"))?;

    let mut msg = LinkMessage::default();
    msg.attributes.push(LinkAttribute::IfName(name.to_owned()));
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST;
    header.sequence_number = 1;
    let mut req = NetlinkMessage::new(
        header,
        NetlinkPayload::from(RouteNetlinkMessage::GetLink(msg)),
    );
    req.finalize();
    let mut buf = vec![0u8; req.buffer_len()];
    req.serialize(&mut buf);
    socket.send(&buf, 0).map_err(nl("send RTM_GETLINK"))?;

    let (reply, _) = socket.recv_from_full().map_err(nl("recv RTM_GETLINK"))?;
    let parsed = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&reply).map_err(|e| {
        LinkError::Netlink {
            op: "parse RTM_NEWLINK",
            source: io::Error::new(io::ErrorKind::InvalidData, e.to_string()),
        }
    })?;
    match parsed.payload {
        NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewLink(link)) => Ok(from_message(&link)),
        NetlinkPayload::Error(err) => {
            let source = err.to_io();
            if source.raw_os_error() == Some(libc::ENODEV) {
                Err(LinkError::NotFound {
                    iface: name.to_owned(),
                })
            } else {
                Err(LinkError::Netlink {
                    op: "RTM_GETLINK",
                    source,
                })
            }
        }
        other => Err(LinkError::Netlink {
            op: "RTM_GETLINK",
            source: io::Error::new(
                io::ErrorKind::InvalidData,
                format!("unexpected reply {other:?}"),
            ),
        }),
    }
}

fn from_message(msg: &LinkMessage) -> Link {
    let mut link = Link {
        ifindex: msg.header.index,
        name: String::new(),
        admin_up: msg.header.flags.contains(LinkFlags::Up),
        oper_state: "unknown".to_owned(),
        has_l2_header: matches!(
            msg.header.link_layer_type,
            LinkLayerType::Ether | LinkLayerType::Loopback
        ),
        tx_queues: 1,
        mtu_bytes: 0,
        gso: None,
        is_ifb: false,
    };
    let mut ipv4_gso = None;
    for attr in &msg.attributes {
        match attr {
            LinkAttribute::IfName(n) => link.name = n.clone(),
            LinkAttribute::NumTxQueues(q) => link.tx_queues = *q,
            LinkAttribute::Mtu(m) => link.mtu_bytes = *m,
            LinkAttribute::GsoMaxSize(g) => {
                link.gso = Some(GsoSizes {
                    max_bytes: *g,
                    ipv4_max_bytes: None,
                })
            }
            LinkAttribute::GsoIpv4MaxSize(g) => ipv4_gso = Some(*g),
            LinkAttribute::LinkInfo(info) => {
                link.is_ifb = info
                    .iter()
                    .any(|i| matches!(i, LinkInfo::Kind(InfoKind::Ifb)));
            }
            LinkAttribute::OperState(s) => {
                link.oper_state = match s {
                    State::Up => "up",
                    State::Down => "down",
                    State::LowerLayerDown => "lowerlayerdown",
                    State::Dormant => "dormant",
                    State::NotPresent => "notpresent",
                    State::Testing => "testing",
                    _ => "unknown",
                }
                .to_owned()
            }
            _ => {}
        }
    }
    if let Some(g) = link.gso.as_mut() {
        g.ipv4_max_bytes = ipv4_gso;
    }
    link
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for good in [
            "eth0",
            "veth-a",
            "wan.100",
            "pppoe-wan",
            "a",
            "fifteen_chars__",
        ] {
            assert!(valid_name(good), "{good}");
        }
        for bad in [
            "",
            ".",
            "..",
            "a/b",
            "a:b",
            "a b",
            "sixteen_chars___",
            "tab\t",
        ] {
            assert!(!valid_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn an_ifb_is_known_by_its_kind() {
        let mut msg = LinkMessage::default();
        msg.attributes
            .push(LinkAttribute::IfName("ifb4wan0".into()));
        assert!(!from_message(&msg).is_ifb);
        msg.attributes
            .push(LinkAttribute::LinkInfo(vec![LinkInfo::Kind(
                InfoKind::Veth,
            )]));
        assert!(!from_message(&msg).is_ifb);
        msg.attributes.pop();
        msg.attributes
            .push(LinkAttribute::LinkInfo(vec![LinkInfo::Kind(InfoKind::Ifb)]));
        let link = from_message(&msg);
        assert!(link.is_ifb && link.name == "ifb4wan0", "{link:?}");
    }

    #[test]
    fn loopback_is_found_and_unknown_is_not_found() {
        // Read-only queries, safe anywhere: every namespace has `lo`.
        let lo = link_by_name("lo").expect("lo exists");
        assert_eq!(lo.ifindex, 1);
        assert_eq!(lo.name, "lo");
        assert!(lo.tx_queues >= 1);
        match link_by_name("nosuchif0") {
            Err(LinkError::NotFound { iface }) => assert_eq!(iface, "nosuchif0"),
            other => panic!("expected NotFound, got {other:?}"),
        }
    }
}

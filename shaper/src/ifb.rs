//! Creating and removing the IFB device that `--ingress-mode ifb` shapes
//! the download on, over rtnetlink (no `ip` command).
//!
//! Name: `ifb4<iface>` (sqm-scripts' convention), cut to the kernel's 15
//! bytes. Invariants: the caller records the name before creating the
//! device, and the ifindex right after, so `shaper cleanup` can remove a
//! device a killed run left behind; removing a device that is already gone
//! is not an error. Non-goals: IFB devices the shaper did not create.

use netlink_packet_core::{Emitable, NLM_F_CREATE, NLM_F_EXCL};
use netlink_packet_route::link::{InfoKind, LinkAttribute, LinkFlags, LinkInfo, LinkMessage};

use crate::{
    link::link_by_name,
    tc::{TcError, netlink::Netlink},
};

/// `RTM_NEWLINK`, `RTM_DELLINK` and `RTM_SETLINK` in
/// `include/uapi/linux/rtnetlink.h`.
const RTM_NEWLINK: u16 = 16;
const RTM_DELLINK: u16 = 17;
const RTM_SETLINK: u16 = 19;

/// Failures creating or removing the IFB.
#[derive(Debug, thiserror::Error)]
pub enum IfbError {
    /// The name is taken, most likely by a run that was killed.
    #[error(
        "a device named '{name}' already exists: if a killed `shaper run` left it, run `shaper \
         cleanup`; otherwise remove or rename it"
    )]
    Exists {
        /// The name.
        name: String,
    },
    /// A netlink request failed.
    #[error("{op} '{name}': {detail}")]
    Netlink {
        /// What was being done.
        op: &'static str,
        /// The device.
        name: String,
        /// The errno and the kernel's message.
        detail: String,
    },
}

/// The IFB's name for `iface`: `ifb4<iface>`, at most 15 bytes.
pub fn name_for(iface: &str) -> String {
    let mut name = format!("ifb4{iface}");
    while name.len() > 15 {
        name.pop();
    }
    name
}

fn request(
    op: &'static str,
    name: &str,
    ty: u16,
    flags: u16,
    msg: &LinkMessage,
) -> Result<(), IfbError> {
    let mut body = vec![0u8; msg.buffer_len()];
    msg.emit(&mut body);
    let err = |detail: String| IfbError::Netlink {
        op,
        name: name.to_owned(),
        detail,
    };
    let mut nl = Netlink::open().map_err(|e| err(e.to_string()))?;
    nl.request(ty, flags, &body).map(drop).map_err(|e| {
        if e.errno() == Some(libc::EEXIST) {
            return IfbError::Exists {
                name: name.to_owned(),
            };
        }
        err(match e.kernel {
            Some(k) => format!("{}: {k}", e.source),
            None => e.source.to_string(),
        })
    })
}

/// The body of an `RTM_NEWLINK` request for an IFB named `name`.
fn new_ifb(name: &str) -> LinkMessage {
    let mut msg = LinkMessage::default();
    msg.attributes.push(LinkAttribute::IfName(name.to_owned()));
    msg.attributes
        .push(LinkAttribute::LinkInfo(vec![LinkInfo::Kind(InfoKind::Ifb)]));
    msg
}

/// Creates the IFB `name`, sets it up, and returns its ifindex.
pub fn create(name: &str) -> Result<u32, IfbError> {
    request(
        "creating the IFB",
        name,
        RTM_NEWLINK,
        NLM_F_CREATE | NLM_F_EXCL,
        &new_ifb(name),
    )?;
    let link = link_by_name(name).map_err(|e| IfbError::Netlink {
        op: "looking up the new IFB",
        name: name.to_owned(),
        detail: e.to_string(),
    })?;
    let mut up = LinkMessage::default();
    up.header.index = link.ifindex;
    up.header.flags = LinkFlags::Up;
    up.header.change_mask = LinkFlags::Up;
    request("setting up the IFB", name, RTM_SETLINK, 0, &up)?;
    Ok(link.ifindex)
}

/// Removes the IFB `name` whose ifindex a killed run never recorded: it
/// died between creating the device and storing its ifindex. The run
/// refused to start while any device had that name, so an IFB of that name
/// now is the one it created; anything else of that name is left alone.
pub fn remove_unrecorded(name: &str) -> Result<(), IfbError> {
    match link_by_name(name) {
        Ok(l) if l.is_ifb => remove(name, l.ifindex),
        _ => Ok(()),
    }
}

/// True if the kernel can create an IFB device (`CONFIG_IFB`, module
/// `ifb`; OpenWrt's kmod-ifb). The device is created in a private network
/// namespace ([`crate::tc::probe`]), which the kernel frees with it when the
/// probe's thread ends, so nobody sees it. On a modular kernel the request
/// loads the module, as creating the real device would.
pub fn probe() -> Result<bool, TcError> {
    crate::tc::probe::in_private_netns(|| {
        let msg = new_ifb("ifb-probe");
        let mut body = vec![0u8; msg.buffer_len()];
        msg.emit(&mut body);
        let mut nl = crate::tc::open()?;
        match nl.request(RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL, &body) {
            Ok(_) => Ok(true),
            // No such link kind: rtnl_newlink's "Unknown device type".
            Err(e) if matches!(e.errno(), Some(libc::EOPNOTSUPP | libc::ENOENT)) => Ok(false),
            Err(e) => Err(TcError::request("probe", "link kind ifb")(e)),
        }
    })
}

/// Removes the IFB `ifindex` if it still exists with `name`.
pub fn remove(name: &str, ifindex: u32) -> Result<(), IfbError> {
    match link_by_name(name) {
        Ok(l) if l.ifindex == ifindex => {}
        // Gone, or the name now belongs to another device: not ours.
        _ => return Ok(()),
    }
    let mut msg = LinkMessage::default();
    msg.header.index = ifindex;
    request("removing the IFB", name, RTM_DELLINK, 0, &msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_sqm_and_fit_the_kernel() {
        assert_eq!(name_for("eth0"), "ifb4eth0");
        assert_eq!(name_for("wan0"), "ifb4wan0");
        let long = name_for("enp0s31f6abcdef");
        assert_eq!(long, "ifb4enp0s31f6ab");
        assert_eq!(long.len(), 15);
        assert!(crate::link::valid_name(&long));
    }
}

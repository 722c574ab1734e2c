//! What `shaper run` watches while it holds an interface: the interface
//! itself (deleted, or deleted and made again under the same name) and, when
//! it shapes egress, its root qdisc (replaced by another tool).
//!
//! Either ends the run as a failure (exit 1). The undo that follows already
//! knows both cases: for a deleted interface it removes only the shaper's own
//! state (pins, record, IFB), and a root that is no longer the shaper's is
//! left as it is, since it is someone else's now.
//!
//! Units: the check runs every [`WATCH_PERIOD`], so a change is noticed
//! within that period plus one netlink round trip. Non-goals: watching the
//! IFB's own root, or the classifier's hook (a detached hook is visible in
//! the counters and `status`).

use std::time::Duration;

use crate::{
    link::{LinkError, link_by_name},
    tc,
};

/// How often the interface and its root qdisc are checked.
pub const WATCH_PERIOD: Duration = Duration::from_millis(500);

/// Why the run lost its interface.
#[derive(Debug, thiserror::Error)]
pub enum Lost {
    /// The interface is gone, or a new one has its name.
    #[error(
        "{iface} was deleted while shaped (ifindex {ifindex}); the shaper's pins, record and \
         IFB are removed, and there was nothing else to restore"
    )]
    Gone {
        /// The interface's name.
        iface: String,
        /// Its ifindex when shaping began.
        ifindex: u32,
    },
    /// Another tool replaced the shaper's root qdisc.
    #[error(
        "the root qdisc of {iface} was replaced by {found} while shaped; it is left as it is, \
         and the shaper's own state is removed"
    )]
    RootReplaced {
        /// The interface's name.
        iface: String,
        /// What is there now, as `tc qdisc show` starts its line (`htb 1:`).
        found: String,
    },
}

/// Checks the interface `iface` (ifindex `ifindex` when shaping began) and,
/// when `owns_root`, that its root qdisc is still the shaper's. `None` while
/// all is as it was; a lookup that fails for another reason is not a loss.
pub fn check(iface: &str, ifindex: u32, owns_root: bool) -> Option<Lost> {
    match link_by_name(iface) {
        Ok(l) if l.ifindex == ifindex => {}
        Ok(_) | Err(LinkError::NotFound { .. }) => {
            return Some(Lost::Gone {
                iface: iface.to_owned(),
                ifindex,
            });
        }
        Err(_) => return None,
    }
    if !owns_root {
        return None;
    }
    match tc::root_qdisc(ifindex) {
        Ok(Some(root)) if root.handle != tc::SHAPER_HANDLE => Some(Lost::RootReplaced {
            iface: iface.to_owned(),
            found: root.to_string(),
        }),
        _ => None,
    }
}

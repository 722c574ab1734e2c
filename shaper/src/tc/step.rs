//! One netlink request of a filter replay: a filter or an explicit chain,
//! with the `tcmsg` fields and attributes to send. `filters` plans them,
//! `chains` places the chain requests among them, and `restore` sends them
//! in order.

use super::message::{Attr, Handle, TCA_CHAIN, TCA_KIND};

/// One filter creation: the `tcmsg` fields and attributes to send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Step {
    /// `RTM_NEWTFILTER` or, for a chain of its own, `RTM_NEWCHAIN`.
    pub what: Request,
    pub parent: u32,
    pub handle: u32,
    pub info: u32,
    pub attrs: Vec<Attr>,
}

/// What a [`Step`] creates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Request {
    Filter,
    Chain,
}

impl Step {
    pub fn filter(parent: u32, handle: u32, info: u32, attrs: Vec<Attr>) -> Self {
        Self {
            what: Request::Filter,
            parent,
            handle,
            info,
            attrs,
        }
    }

    /// The chain this step creates or puts a filter into.
    pub fn chain(&self) -> u32 {
        super::message::find(&self.attrs, TCA_CHAIN)
            .and_then(Attr::as_u32)
            .unwrap_or(0)
    }

    /// "u32 filter 0x80000800 (pref 1, chain 0) on 1:", "chain 7 on 1:".
    pub fn describe(&self) -> String {
        let kind = super::message::find(&self.attrs, TCA_KIND).and_then(Attr::as_str);
        match self.what {
            Request::Chain => format!("chain {} on {}", self.chain(), Handle(self.parent)),
            Request::Filter => format!(
                "{} filter {:#x} (pref {}, chain {}) on {}",
                kind.unwrap_or("?"),
                self.handle,
                self.info >> 16,
                self.chain(),
                Handle(self.parent)
            ),
        }
    }
}

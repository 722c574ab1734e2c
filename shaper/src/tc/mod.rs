//! Traffic control over raw rtnetlink: record an interface's egress qdisc
//! tree exactly, install the shaper's sch_fq root, and put the recorded
//! tree back on exit.
//!
//! This first step holds the wire format (`message`) and the socket
//! (`netlink`); snapshot, install and restore build on them.

#![allow(dead_code, reason = "used by the snapshot and restore code that follows")]

pub mod message;
mod netlink;

//! Raw rtnetlink traffic-control: snapshot, install, restore (written by a helper).

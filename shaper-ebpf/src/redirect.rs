//! The ingress half of `--ingress-mode ifb`: every packet arriving on the
//! interface is counted and redirected to the egress of the IFB named in
//! `SHAPER_REDIRECT`, where sch_fq and the fair pacer (a load of its own,
//! with `FLAG_DELIVERY_MONO`) shape it. With no IFB set (0) it passes.
//!
//! `bpf_redirect` to a device's egress clears a receive-time `skb->tstamp`
//! on the way (net/core/filter.c, `__bpf_tx_skb`), so sch_fq on the IFB
//! does not take it for a departure time. Non-goals: choosing packets
//! (everything goes), redirecting to ingress.

use aya_ebpf::{helpers::bpf_redirect, macros::classifier, programs::TcContext};
use shaper_common::counters::Counter;

use crate::{
    hook::TC_ACT_UNSPEC,
    maps::{REDIRECT, count},
};

#[classifier]
pub fn shaper_redirect(ctx: TcContext) -> i32 {
    match try_shaper_redirect(&ctx) {
        Ok(verdict) | Err(verdict) => verdict,
    }
}

#[inline(always)]
fn try_shaper_redirect(ctx: &TcContext) -> Result<i32, i32> {
    count(Counter::Packets, 1);
    count(Counter::Bytes, u64::from(ctx.len()));
    let ifindex = match REDIRECT.get(0) {
        Some(&i) if i != 0 => i,
        _ => {
            count(Counter::PassedUnpaced, 1);
            return Ok(TC_ACT_UNSPEC);
        }
    };
    // SAFETY: bpf_redirect takes plain integers; it returns TC_ACT_REDIRECT,
    // or TC_ACT_SHOT when the flags are invalid (they are 0).
    let verdict = unsafe { bpf_redirect(ifindex, 0) };
    Ok(verdict as i32)
}

//! The pipeline's memory over a long run: the soak's traffic through the
//! ring, the flow table and each interval's work.
use ringbuf::traits::Observer;
use shaper_common::event::{
    EVENT_F_SAMPLED, EVENT_FLOW_END, EVENT_FLOW_START, EVENT_PACKET, FlowKey, VERDICT_AQM_DROP,
    VERDICT_CE, VERDICT_PACED, VERDICT_PASS,
};

use super::*;

/// Bytes of `[ptr, ptr + len)` the kernel holds in memory, by page
/// (`mincore`): what the resident set counts, whatever was allocated.
fn resident_bytes(ptr: *const u8, len: usize) -> usize {
    // SAFETY: sysconf reads a constant of the system.
    let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).expect("page");
    let start = ptr as usize / page * page;
    let end = (ptr as usize + len).div_ceil(page) * page;
    let mut pages = vec![0u8; (end - start) / page];
    // SAFETY: `[start, end)` is page-aligned and lies in mappings of
    // this process (an allocation rounded out to its pages), and
    // `pages` has one byte per page of it.
    let rc = unsafe { libc::mincore(start as *mut libc::c_void, end - start, pages.as_mut_ptr()) };
    assert_eq!(rc, 0, "mincore: {}", std::io::Error::last_os_error());
    pages.iter().filter(|&&p| p & 1 != 0).count() * page
}

/// Resident bytes of the ring's storage; the ring must be empty, so its
/// vacant slices are the whole storage.
fn ring_resident_bytes(prod: &HeapProd<Event>) -> usize {
    let (a, b) = prod.vacant_slices();
    assert_eq!(
        a.len() + b.len(),
        prod.capacity().get(),
        "the ring is empty"
    );
    [a, b]
        .iter()
        .filter(|s| !s.is_empty())
        .map(|s| resident_bytes(s.as_ptr().cast(), std::mem::size_of_val(*s)))
        .sum()
}

/// A flow of its own for each id below 2^24 (its source address).
fn key(id: u32) -> FlowKey {
    let [_, b, c, d] = id.to_be_bytes();
    let mut k = FlowKey {
        sport_be: (1024 + (id % 60_000) as u16).to_be(),
        dport_be: 5201u16.to_be(),
        proto: 6,
        family: 4,
        ..FlowKey::default()
    };
    k.saddr[..4].copy_from_slice(&[10, b, c, d]);
    k.daddr[..4].copy_from_slice(&[10, 9, 0, 2]);
    k
}

fn event(id: u32, ts_ns: u64, kind: u8, verdict: u8, sampled: bool, delay_ns: u64) -> Event {
    Event {
        ts_ns,
        delay_ns,
        key: key(id),
        len_bytes: 1500,
        kind,
        verdict,
        flags: if sampled { EVENT_F_SAMPLED } else { 0 },
        ..Event::default()
    }
}

/// One second of the soak's traffic as the pacer reports it at
/// 50 Mbit/s with 1-in-64 sampling: six bulk flows that live 20 s each
/// and end with a reset, beside back-to-back 100 KB transfers, six a
/// second, each a flow of its own (one in eight just goes quiet and
/// ages out); 65 sampled packets with pacing delays, three AQM drops
/// and two CE marks. About 80 records.
struct Soak {
    next_id: u32,
    /// Each slot's flow and the second it ends.
    bulk: [(u32, u64); 6],
    rng: u64,
}

impl Soak {
    fn new() -> Self {
        Self {
            next_id: 1,
            bulk: [(0, 0); 6],
            rng: 0x9e37_79b9_7f4a_7c15,
        }
    }

    fn draw(&mut self, n: u64) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng % n
    }

    fn new_flow(&mut self) -> u32 {
        self.next_id += 1;
        self.next_id
    }

    fn second(&mut self, s: u64, out: &mut Vec<Event>) {
        let t0 = s * 1_000_000_000;
        let at = |k: u64| t0 + k * 10_000_000;
        for slot in 0..self.bulk.len() {
            let (id, ends_s) = self.bulk[slot];
            if id != 0 && s < ends_s {
                continue;
            }
            if id != 0 {
                out.push(event(id, at(0), EVENT_FLOW_END, VERDICT_PASS, false, 0));
            }
            // The slots are staggered by a sixth of a life, as the soak's.
            let life_s = if id == 0 {
                20 - slot as u64 * 20 / 6
            } else {
                20
            };
            let id = self.new_flow();
            self.bulk[slot] = (id, s + life_s);
            out.push(event(id, at(1), EVENT_FLOW_START, VERDICT_PASS, false, 0));
        }
        for k in 0..59 {
            let (id, _) = self.bulk[self.draw(6) as usize];
            let delay_ns = 500_000 + self.draw(20_000_000);
            out.push(event(
                id,
                at(2 + k),
                EVENT_PACKET,
                VERDICT_PACED,
                true,
                delay_ns,
            ));
        }
        for (k, verdict) in [VERDICT_AQM_DROP, VERDICT_AQM_DROP, VERDICT_AQM_DROP]
            .into_iter()
            .chain([VERDICT_CE, VERDICT_CE])
            .enumerate()
        {
            let (id, _) = self.bulk[self.draw(6) as usize];
            let delay_ns = 15_000_000 + self.draw(10_000_000);
            out.push(event(
                id,
                at(61 + k as u64),
                EVENT_PACKET,
                verdict,
                false,
                delay_ns,
            ));
        }
        for k in 0..6 {
            let id = self.new_flow();
            let t = at(70 + 4 * k);
            out.push(event(id, t, EVENT_FLOW_START, VERDICT_PASS, false, 0));
            let delay_ns = self.draw(5_000_000);
            out.push(event(
                id,
                t + 1,
                EVENT_PACKET,
                VERDICT_PACED,
                true,
                delay_ns,
            ));
            if self.draw(8) != 0 {
                out.push(event(id, t + 2, EVENT_FLOW_END, VERDICT_PASS, false, 0));
            }
        }
    }
}

/// `/proc/self/status` `RssAnon`, KiB (the whole test process: shown,
/// not judged, as other tests run beside this one).
fn rss_anon_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("RssAnon:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// A ring whose pages enter memory as records first reach them grows
/// the controller in a straight line until its index wraps, which a
/// soak cannot tell from a leak. The soak's traffic runs here through
/// the ring, the flow table and each interval's work for ten simulated
/// minutes, and the ring's resident bytes after the warm-up are what
/// they are at the end.
#[test]
fn memory_stays_flat_as_thousands_of_flows_come_and_go() {
    let opts = PipelineOptions::new("wan0", "shaper", Output::Quiet);
    let (mut prod, mut cons) = spsc(opts.spsc_events.max(1024));
    let mut table = FlowTable::new(FlowTableOptions {
        sample_every: 64,
        ..opts.table
    })
    .expect("table");
    let mut out = view::Emitter::new(opts.output, &opts.iface, opts.source, opts.top);
    let mut soak = Soak::new();
    let mut batch = Vec::new();
    let (mut records, mut at_warm_up) = (0u64, None);
    let warm_up_s = 60;
    let length_s = 600;
    for s in 0..length_s {
        batch.clear();
        soak.second(s, &mut batch);
        for e in &batch {
            assert!(prod.try_push(*e).is_ok(), "the ring has room");
            records += 1;
        }
        drain_spsc(&mut cons, &mut table);
        let window = table.take_window();
        table.tick((s + 1) * 1_000_000_000);
        let summary = Summary::from_table(&opts.iface, &table, 0, Readings::default());
        out.interval(Duration::from_secs(s + 1), &table, &summary, &window);
        let text = metrics::render(&opts.iface, &table, &summary, &window, opts.top);
        assert!(text.contains("shaper_flows"));
        if s + 1 == warm_up_s {
            at_warm_up = Some((ring_resident_bytes(&prod), rss_anon_kib()));
        }
    }
    let (ring_warm, rss_warm) = at_warm_up.expect("warm-up sample");
    let (ring_end, rss_end) = (ring_resident_bytes(&prod), rss_anon_kib());
    eprintln!(
        "{} flows, {records} records: ring resident {} KiB at {warm_up_s} s, {} KiB at \
         {length_s} s (of {} KiB); process RssAnon {rss_warm} KiB, then {rss_end} KiB; \
         {} flows and {} histograms in the table at the end",
        soak.next_id - 1,
        ring_warm / 1024,
        ring_end / 1024,
        prod.capacity().get() * std::mem::size_of::<Event>() / 1024,
        table.len(),
        table.histograms(),
    );
    assert!(soak.next_id > 3_000, "thousands of flows came and went");
    assert!(table.len() < 100, "the table holds only the recent flows");
    assert!(
        ring_end <= ring_warm + 64 * 1024,
        "the ring grew from {} KiB to {} KiB after the warm-up",
        ring_warm / 1024,
        ring_end / 1024
    );
}

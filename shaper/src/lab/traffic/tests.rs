//! Parsers of iperf3 and ping output, on output captured in the 6.12 VM
//! (iperf 3.12, trimmed to the fields the lab reads).

use super::*;

const TCP: &str = include_str!("iperf3-tcp.json");
const UDP: &str = include_str!("iperf3-udp.json");

#[test]
fn tcp_report_takes_receiver_goodput_and_sender_retransmits() {
    let r = IperfReport::parse(TCP).expect("parses");
    assert!((r.receiver_bps - 18_689_635.143).abs() < 1.0, "{r:?}");
    assert!((r.sender_bps - 18_656_377.948).abs() < 1.0, "{r:?}");
    assert_eq!(r.retransmits, 46);
    assert_eq!(r.stream_bps.len(), 2);
    assert!((r.stream_bps[0] - 9_336_086.817).abs() < 1.0);
    assert_eq!(r.lost_percent, 0.0);
    assert_eq!(r.error, None);
    // The server's series: one omitted second, then two measured ones.
    assert_eq!(r.intervals.len(), 3);
    assert!(r.intervals[0].omitted && !r.intervals[1].omitted);
    assert!((r.intervals[2].bps - 18_508_253.89).abs() < 1.0);
}

#[test]
fn steady_intervals_leave_out_the_warm_up_the_first_and_the_cut_last() {
    let interval = |start: f64, end: f64, omitted: bool| Interval {
        start,
        end,
        bps: end,
        omitted,
    };
    let r = IperfReport {
        intervals: vec![
            interval(0.0, 1.0, true),
            interval(0.0, 1.0, false),
            interval(1.0, 2.0, false),
            interval(2.0, 2.95, false),
            interval(2.95, 3.0, false),
        ],
        ..IperfReport::default()
    };
    let ends: Vec<f64> = r.steady_intervals().map(|i| i.end).collect();
    assert_eq!(ends, [2.0, 2.95]);
    // The fixture's series: one omitted, two measured, all whole.
    let r = IperfReport::parse(TCP).expect("parses");
    assert_eq!(r.steady_intervals().count(), 1);
}

#[test]
fn udp_report_counts_what_arrived() {
    let r = IperfReport::parse(UDP).expect("parses");
    assert!((r.receiver_bps - 19_303_818.31).abs() < 1.0, "{r:?}");
    assert!((r.sender_bps - 20_112_451.39).abs() < 1.0, "{r:?}");
    assert!((r.lost_percent - 3.466).abs() < 0.001);
    assert_eq!(r.retransmits, 0);
}

#[test]
fn iperf3_errors_and_noise() {
    let r = IperfReport::parse(
        "warning: ignored\n{\"start\":{},\"intervals\":[],\"end\":{},\
         \"error\":\"unable to connect to server: Connection refused\"}\ntrailing",
    )
    .expect("an error report still parses");
    assert_eq!(
        r.error.as_deref(),
        Some("unable to connect to server: Connection refused")
    );
    assert!(IperfReport::parse("iperf3: error").is_err());
    assert!(
        IperfReport::parse("{\"end\":{}}").is_err(),
        "no sum_received"
    );
}

#[test]
fn flow_labels() {
    let f = FlowSpec::tcp(Host::Client2, 2).with_cc("bbr");
    assert_eq!(f.label(), "client2 2×tcp bbr");
    let r: Rate = "100mbit".parse().expect("valid");
    assert_eq!(
        FlowSpec::udp(Host::Client, r).label(),
        "client 1×udp @100Mbit"
    );
}

#[test]
fn listening_sockets_in_proc_net_tcp() {
    let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 02034B0A:1451 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0000000000000000 100 0 0 10 0
   1: 02034B0A:1452 02014B0A:9C40 01 00000000:00000000 00:00000000 00000000     0        0 2 1 0000000000000000 20 4 30 10 -1
";
    assert!(tcp_listens(table, 5201));
    assert!(!tcp_listens(table, 5202), "established, not listening");
    assert!(!tcp_listens(table, 5203));
    assert!(!tcp_listens("", 5201));
}

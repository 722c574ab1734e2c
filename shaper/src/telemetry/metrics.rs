//! A Prometheus text endpoint (exposition format 0.0.4) for `--metrics`.
//!
//! Names follow Prometheus conventions: a `shaper_` prefix, base units in
//! the name (`_seconds`, `_bytes`), `_total` on counters. Per interface:
//! the kernel's exact counters as `shaper_<name>_total`, its gauges as
//! `shaper_<name>` (the fair pacer's `fair_multiplier`,
//! `fair_share_bytes_per_second`, `fair_active_flows`,
//! `fair_backlogged_flows` and `fair_committed_flows`), the sampled
//! delay as a summary `shaper_delay_seconds{quantile=…}`, and
//! `shaper_flows`. Per tin, when the pacer runs more than one (label
//! `tin`, CAKE's name for it): `shaper_tin_packets_total`,
//! `shaper_tin_bytes_total`, `shaper_tin_drops_total`,
//! `shaper_tin_marks_total`, `shaper_tin_delay_seconds_total` (the
//! scheduled delay of its packets, summed: divided by the packets' rate,
//! the mean delay), and the gauges `shaper_tin_share_bytes_per_second` and
//! `shaper_tin_threshold_bytes_per_second`. Per flow, only the top N by rate (bounding label
//! cardinality): `shaper_flow_rate_bytes_per_second`,
//! `shaper_flow_bytes_total`, `shaper_flow_delay_seconds{quantile=…}`,
//! `shaper_flow_drops_total` and `shaper_flow_marks_total`.
//!
//! The server is hyper's HTTP/1.1: `GET /metrics` gets the last rendered
//! text (refreshed each interval), one request per connection. It binds
//! where told (the CLI's default is loopback), and a LAN address must
//! survive careless and hostile clients, so connections are capped (the
//! oldest goes when a newcomer comes), a request head has a deadline, and a
//! failed accept backs off instead of spinning (see [`serve`]). Non-goals: keep-alive, TLS, auth.

use std::fmt::Write as _;

use std::{
    collections::BTreeMap,
    convert::Infallible,
    sync::{Arc, Mutex},
    time::Duration,
};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{
    Method, Request, Response, StatusCode,
    body::Incoming,
    header::{CONTENT_TYPE, HeaderValue},
    server::conn::http1,
    service::service_fn,
};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::{net::TcpListener, sync::watch, task::AbortHandle};
use tracing::debug;

use super::{FlowTable, Summary, Window, flow_label};

/// Connections the kernel completes and queues before [`serve`] accepts
/// them. A burst of connects beyond the queue has its SYNs dropped, and
/// each such client, a scraper among them, waits out a SYN retransmission
/// (a second at first), so the queue is sized for bursts rather than left
/// at the usual 128. The kernel caps it at `net.core.somaxconn`.
pub const LISTEN_BACKLOG: i32 = 1024;

/// Binds the metrics listener. Commands call this before they change
/// anything, so an address in use is refused with nothing to undo.
pub fn bind(addr: std::net::SocketAddr) -> Result<std::net::TcpListener, super::TelemetryError> {
    use socket2::{Domain, Socket, Type};
    let listen = |source| super::TelemetryError::Listen { addr, source };
    let s = Socket::new(Domain::for_address(addr), Type::STREAM, None).map_err(listen)?;
    // As std's listeners do: a restart can bind while old connections
    // linger in TIME_WAIT.
    s.set_reuse_address(true).map_err(listen)?;
    s.bind(&addr.into()).map_err(listen)?;
    s.listen(LISTEN_BACKLOG).map_err(listen)?;
    s.set_nonblocking(true).map_err(listen)?;
    Ok(s.into())
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The exposition text for one interface.
pub fn render(iface: &str, t: &FlowTable, s: &Summary, w: &Window, top: usize) -> String {
    let i = escape(iface);
    let mut o = String::new();
    for (name, v) in &s.counters {
        let _ = writeln!(o, "# TYPE shaper_{name}_total counter");
        let _ = writeln!(o, "shaper_{name}_total{{iface=\"{i}\"}} {v}");
    }
    for (name, v) in &s.gauges {
        let _ = writeln!(o, "# TYPE shaper_{name} gauge");
        let _ = writeln!(o, "shaper_{name}{{iface=\"{i}\"}} {v}");
    }
    let _ = writeln!(o, "# HELP shaper_flows Flows the controller tracks.");
    let _ = writeln!(o, "# TYPE shaper_flows gauge");
    let _ = writeln!(o, "shaper_flows{{iface=\"{i}\"}} {}", s.flows);
    let _ = writeln!(
        o,
        "# HELP shaper_events_dropped_user_total Events the controller had no room for."
    );
    let _ = writeln!(o, "# TYPE shaper_events_dropped_user_total counter");
    let _ = writeln!(
        o,
        "shaper_events_dropped_user_total{{iface=\"{i}\"}} {}",
        s.events_dropped_user
    );
    let _ = writeln!(
        o,
        "# HELP shaper_delay_seconds Queueing delay of sampled packets over the last interval \
         (scheduled by the pacer, or measured by the tracer)."
    );
    let _ = writeln!(o, "# TYPE shaper_delay_seconds summary");
    // Quantiles over the last interval, as Prometheus client libraries
    // compute summaries over a sliding window; count and sum are totals.
    for (q, v) in [("0.5", w.p50_ns), ("0.99", w.p99_ns)] {
        let _ = writeln!(
            o,
            "shaper_delay_seconds{{iface=\"{i}\",quantile=\"{q}\"}} {}",
            v as f64 / 1e9
        );
    }
    let _ = writeln!(
        o,
        "shaper_delay_seconds_count{{iface=\"{i}\"}} {}",
        s.events
    );
    render_tins(&mut o, &i, &s.tins);
    let rows = t.top(top);
    let flow_metric = |o: &mut String, name: &str, kind: &str, help: &str| {
        let _ = writeln!(o, "# HELP {name} {help}");
        let _ = writeln!(o, "# TYPE {name} {kind}");
    };
    flow_metric(
        &mut o,
        "shaper_flow_rate_bytes_per_second",
        "gauge",
        "Estimated rate of a top flow over the last interval.",
    );
    for r in &rows {
        let f = escape(&flow_label(r.key));
        let _ = writeln!(
            o,
            "shaper_flow_rate_bytes_per_second{{iface=\"{i}\",flow=\"{f}\"}} {}",
            r.stats.rate_bytes_per_s
        );
    }
    flow_metric(
        &mut o,
        "shaper_flow_bytes_total",
        "counter",
        "Estimated bytes of a top flow.",
    );
    for r in &rows {
        let f = escape(&flow_label(r.key));
        let _ = writeln!(
            o,
            "shaper_flow_bytes_total{{iface=\"{i}\",flow=\"{f}\"}} {}",
            r.stats.bytes
        );
    }
    flow_metric(
        &mut o,
        "shaper_flow_delay_seconds",
        "summary",
        "Queueing delay of a top flow's sampled packets.",
    );
    for r in &rows {
        let f = escape(&flow_label(r.key));
        for (q, x) in [("0.5", 0.5), ("0.99", 0.99)] {
            if let Some(v) = r.stats.delay_quantile_ns(x) {
                let _ = writeln!(
                    o,
                    "shaper_flow_delay_seconds{{iface=\"{i}\",flow=\"{f}\",quantile=\"{q}\"}} {}",
                    v as f64 / 1e9
                );
            }
        }
    }
    for (name, help, get) in [
        (
            "shaper_flow_drops_total",
            "Packets of a top flow dropped by the AQM or the horizon.",
            (|s: &super::FlowStats| s.aqm_drops + s.horizon_drops) as fn(&super::FlowStats) -> u64,
        ),
        (
            "shaper_flow_marks_total",
            "Packets of a top flow CE-marked.",
            |s: &super::FlowStats| s.marks,
        ),
    ] {
        flow_metric(&mut o, name, "counter", help);
        for r in &rows {
            let f = escape(&flow_label(r.key));
            let _ = writeln!(o, "{name}{{iface=\"{i}\",flow=\"{f}\"}} {}", get(r.stats));
        }
    }
    o
}

/// The per-tin families, each with its HELP and TYPE once; nothing with
/// one tin.
fn render_tins(o: &mut String, iface: &str, tins: &[crate::tin_status::TinStatus]) {
    use crate::tin_status::TinStatus;
    type Get = fn(&TinStatus) -> f64;
    let families: [(&str, &str, &str, Get); 7] = [
        ("packets_total", "counter", "Packets of a tin.", |t| {
            t.packets as f64
        }),
        ("bytes_total", "counter", "Wire bytes of a tin.", |t| {
            t.bytes as f64
        }),
        ("drops_total", "counter", "Packets of a tin dropped.", |t| {
            t.drops as f64
        }),
        (
            "marks_total",
            "counter",
            "Packets of a tin CE-marked.",
            |t| t.marks as f64,
        ),
        (
            "delay_seconds_total",
            "counter",
            "Scheduled delay of a tin's packets, summed.",
            |t| t.delay_ns as f64 / 1e9,
        ),
        (
            "share_bytes_per_second",
            "gauge",
            "What each backlogged flow of a tin gets now.",
            |t| t.share_bytes_per_s as f64,
        ),
        (
            "threshold_bytes_per_second",
            "gauge",
            "The rate a tin holds with priority.",
            |t| t.threshold_bytes_per_s as f64,
        ),
    ];
    if tins.is_empty() {
        return;
    }
    for (name, kind, help, get) in families {
        let _ = writeln!(o, "# HELP shaper_tin_{name} {help}");
        let _ = writeln!(o, "# TYPE shaper_tin_{name} {kind}");
        for t in tins {
            let _ = writeln!(
                o,
                "shaper_tin_{name}{{iface=\"{iface}\",tin=\"{}\"}} {}",
                escape(t.name),
                get(t)
            );
        }
    }
}

/// Most connections served at once, so no number of clients can take
/// every descriptor.
pub const MAX_CONNECTIONS: usize = 64;

/// A client must send its whole request head within this, or it is cut off:
/// idle and one-byte-a-second clients cannot hold a slot for long.
pub const HEAD_DEADLINE: Duration = Duration::from_secs(2);

/// The longest a connection lives, request and response together.
pub const CONNECTION_DEADLINE: Duration = Duration::from_secs(10);

/// The first and the longest pause after a failed accept (out of
/// descriptors, say): the loop backs off instead of spinning.
const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(10);
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// The connections being served, oldest first (ids grow with each accept).
#[derive(Default)]
struct Live {
    next_id: u64,
    tasks: BTreeMap<u64, AbortHandle>,
}

/// Serves the latest text over HTTP/1.1 until the task is aborted: `GET
/// /metrics` (or `/`) gets it, anything else a 404. One request per
/// connection, each cut at [`HEAD_DEADLINE`] if its head is not in and at
/// [`CONNECTION_DEADLINE`] in all.
///
/// At [`MAX_CONNECTIONS`] a newcomer closes the oldest connection. The
/// accept loop never waits for a slot, so the kernel's backlog keeps
/// draining, and a scraper, which sends its request at once and is done in
/// milliseconds, gets through however many clients sit idle: the ones that
/// go are those that have held a slot longest without finishing.
pub async fn serve(listener: TcpListener, text: watch::Receiver<String>) {
    let live = Arc::new(Mutex::new(Live::default()));
    let mut backoff = ACCEPT_BACKOFF_MIN;
    loop {
        let (sock, peer) = match listener.accept().await {
            Ok(accepted) => {
                backoff = ACCEPT_BACKOFF_MIN;
                accepted
            }
            Err(e) => {
                debug!(error = %e, pause_ms = backoff.as_millis(), "metrics accept failed; backing off");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(ACCEPT_BACKOFF_MAX);
                continue;
            }
        };
        let text = text.clone();
        let done = Arc::clone(&live);
        let mut guard = live
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        while guard.tasks.len() >= MAX_CONNECTIONS {
            if let Some((_, oldest)) = guard.tasks.pop_first() {
                oldest.abort();
            }
        }
        let id = guard.next_id;
        guard.next_id += 1;
        let task = tokio::spawn(async move {
            let service = service_fn(move |req: Request<Incoming>| {
                let body = text.borrow().clone();
                async move { Ok::<_, Infallible>(respond(&req, body)) }
            });
            let conn = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEAD_DEADLINE)
                .keep_alive(false)
                .serve_connection(TokioIo::new(sock), service);
            match tokio::time::timeout(CONNECTION_DEADLINE, conn).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => debug!(%peer, error = %e, "metrics client failed"),
                Err(_) => debug!(%peer, "metrics client cut off at the connection deadline"),
            }
            done.lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .tasks
                .remove(&id);
        });
        guard.tasks.insert(id, task.abort_handle());
    }
}

/// The response to one request: the text for `GET /metrics` or `GET /`.
fn respond(req: &Request<Incoming>, body: String) -> Response<Full<Bytes>> {
    let ok = req.method() == Method::GET && matches!(req.uri().path(), "/metrics" | "/");
    let (status, body) = if ok {
        (StatusCode::OK, body)
    } else {
        (StatusCode::NOT_FOUND, "try GET /metrics\n".to_owned())
    };
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4"),
    );
    resp
}

#[cfg(test)]
mod tests {
    use shaper_common::event::{EVENT_F_SAMPLED, EVENT_PACKET, Event, VERDICT_PACED};

    use super::*;
    use crate::telemetry::FlowTableOptions;

    #[test]
    fn renders_prometheus_text_with_conventional_names() {
        let mut t = FlowTable::new(FlowTableOptions::default()).expect("table");
        let mut e = Event {
            delay_ns: 2_000_000,
            len_bytes: 1000,
            kind: EVENT_PACKET,
            verdict: VERDICT_PACED,
            flags: EVENT_F_SAMPLED,
            ..Event::default()
        };
        e.key.family = 4;
        e.key.proto = 6;
        t.record(&e);
        let readings = super::super::pipeline::Readings {
            counters: vec![("packets", 10), ("events_lost", 0)],
            gauges: vec![("fair_multiplier", 1.5), ("fair_active_flows", 3.0)],
            tins: vec![crate::tin_status::TinStatus {
                tin: 3,
                name: "Voice",
                threshold_bytes_per_s: 250_000,
                share_bytes_per_s: 125_000,
                packets: 4,
                bytes: 4000,
                drops: 1,
                marks: 2,
                delay_ns: 3_000_000,
            }],
        };
        let s = Summary::from_table("wan\"0", &t, 0, readings);
        let w = t.take_window();
        let text = render("wan\"0", &t, &s, &w, 10);
        assert!(
            text.contains("shaper_packets_total{iface=\"wan\\\"0\"} 10"),
            "{text}"
        );
        assert!(text.contains("# TYPE shaper_delay_seconds summary"));
        assert!(
            text.contains("# TYPE shaper_fair_multiplier gauge"),
            "{text}"
        );
        assert!(
            text.contains("shaper_fair_multiplier{iface=\"wan\\\"0\"} 1.5"),
            "{text}"
        );
        assert!(text.contains("shaper_fair_active_flows{iface=\"wan\\\"0\"} 3"));
        assert!(text.contains(
            "shaper_flow_bytes_total{iface=\"wan\\\"0\",flow=\"0.0.0.0 > 0.0.0.0 tcp\"} 1000"
        ));
        assert!(text.contains("quantile=\"0.99\"} 0.002"), "{text}");
        for line in [
            "# TYPE shaper_tin_bytes_total counter",
            "shaper_tin_bytes_total{iface=\"wan\\\"0\",tin=\"Voice\"} 4000",
            "shaper_tin_drops_total{iface=\"wan\\\"0\",tin=\"Voice\"} 1",
            "shaper_tin_delay_seconds_total{iface=\"wan\\\"0\",tin=\"Voice\"} 0.003",
            "# TYPE shaper_tin_share_bytes_per_second gauge",
            "shaper_tin_threshold_bytes_per_second{iface=\"wan\\\"0\",tin=\"Voice\"} 250000",
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
        // Every sample line is `name{labels} value` with a numeric value.
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let v = line.rsplit(' ').next().expect("value");
            assert!(v.parse::<f64>().is_ok(), "{line}");
        }
    }
}

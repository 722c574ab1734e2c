//! `shaper bench`: what the shaper costs and what it delivers, as one JSON
//! document and a short table.
//!
//! Two parts, run separately because they need different kernels:
//! - the host part ([`host`], the default): ns per packet of the egress
//!   classifier on each pacer path and on a 10k-flow mix, measured by the
//!   kernel with `BPF_PROG_TEST_RUN`, against a passthrough classifier; any
//!   kernel with BPF will do, root needed;
//! - the lab part ([`vm`], `--vm-part`): goodput, ping under load and CPU per
//!   Mbit/s of the shaper, CAKE and the aggregate pacer in network
//!   namespaces; needs sch_fq, CAKE and netem (`cargo xtask bench` runs it in
//!   the VM).
//!
//! `--merge-vm F2 --json FILE` adds a lab part's JSON (F2) to a host part's
//! (FILE) under the key `vm`; that is how `cargo xtask bench` joins the two.
//!
//! JSON keys (top level): `schema`, `units`, the host part's fields
//! (`classifier_ns_per_packet`, `passthrough_ns_per_packet`,
//! `pacer_ns_per_packet`, `passthrough_hot_ns_per_packet`,
//! `police_ns_per_packet` (the ingress policer), `aggregate_ns_per_packet`
//! (the aggregate pacer on the same mix, the anchor), `pacer_own_ns`,
//! `aggregate_own_ns`, `own_cost_ratio`, `clock_read_ns` (one clock read,
//! part of both own costs; these four the median rounds of `own_costs`),
//! `own_costs.{rounds, passthrough_ns, clock_read_ns, pacer_own_ns,
//! aggregate_own_ns, own_cost_ratio}` (each `{median, min, max}` over
//! rounds that measure both pacers side by side, [`anchor`]) and
//! `own_costs.{pacer_paced_fraction, aggregate_paced_fraction}`,
//! `verdict_fractions`,
//! `paths.{unpaced, paced, aqm_drop, horizon_drop, flow_mix_10k,
//! flow_mix_10k_unpaced, flow_mix_10k_telemetry, flow_mix_10k_framed,
//! hosts_flow_mix_10k, hosts_nat_flow_mix_10k, aggregate_flow_mix_10k,
//! police_flow_mix_10k, police_flow_mix_10k_unpaced}`,
//! `helper_calls_per_packet` (the paced mix, counted by fentry programs in
//! an untimed pass; null with `helper_calls_error` where the kernel refuses
//! tracing programs; the lab part's count, with `helper_calls_kernel`
//! naming the guest's kernel, when the host's was refused),
//! `helper_calls.<path>.<helper>`,
//! `bpf_insns.{pacer_insns_per_packet, aggregate_insns_per_packet}` and
//! `bpf_insns.paths.<path>.{insns_per_packet, helper_calls_per_packet,
//! helpers.<helper>, intended, intended_fraction}` (BPF instructions and
//! helper calls per packet, counted by the interpreter of [`insns`] on any
//! kernel),
//! `programs.<name>.{xlated_insns, verified_insns}`,
//! `concurrency.{ns_per_packet_1cpu, ns_per_packet_2cpu, ratio, ...}` (the
//! paced mix from one CPU and from two at once, [`concurrency`]; null on
//! one CPU),
//! `kernel_release`, ...), and `vm`
//! (`shaper`, `cake`, `aggregate`, and `ingress.{police, ifb, cake_ingress,
//! ifb_alone}` for the download, each the median over `--state-reps`
//! interleaved runs of `goodput_ratio`, `ping_p50_ms`, `ping_p99_ms`, `softirq_cpu_per_mbit`,
//! and for the shaper's states `bpf_run_ns_per_packet`, the kernel's own
//! time per program run; beside them the spreads `goodput`, `ping_p99` and
//! `cpu` (median, min, max, every run's figure) and `runs`, each run's
//! figures; the
//! traffic cases of [`cases`],
//! `lone_flow.<case>`, `bulk_beside_sparse`, `many_flows.<n>` and
//! `unequal.<case>` (with Jain's index), the
//! timed cases of [`timed`], `churn`, `leave` and `join`, the framing
//! cases of [`overhead`] under `overhead.<atm|ptm|ethernet>.<cake|shaper|
//! shaper_no_overhead>` (`ping_p99_ms`, `goodput_ratio`), the host
//! isolation case of [`isolation`] under `isolation.<cake|shaper>`
//! (`up_host_b_share`, `down_host_b_share`, and the shaper's
//! `up_host_b_share_no_nat`), with
//! `--matrix` the cells of [`matrix`] under `matrix`, each with `shaper`
//! and `cake` medians, and the CPU-bound case of [`cpu_bound`] under
//! `cpu_bound` (`none`, `cake` and `shaper` each way at
//! `--cpu-bound-rate`; null with `--no-cpu-bound`)), or null.
//!
//! With `--vm-part --multiqueue` the lab part runs only the multi-queue
//! and DiffServ cases ([`multiqueue`]), for a kernel with cake_mq; merged,
//! they land under `vm.multiqueue` (`kernel`, `queues`,
//! `states.<shaper|cake_mq|cake_split>` with `single_flow_ratio`,
//! `sum_ratio_max_1s`, `min_flow_share_ratio` and `jain_1v8`, and `rps`)
//! and `vm.diffserv.<shaper|cake|cake_mq>` (`ef_ping_p99_ms`,
//! `ef_loss_pct`, `ef_bulk_share`, and the shaper's `ef_bulk_share_mq`).
//!
//! With `--vm-part --soak[=DURATION]` the lab part runs only the soak
//! ([`vm::soak`], [`crate::lab::soak`]): `vm.soak` holds `flows`,
//! `goodput_ratio`, `rss_drift`, `rss_median_kib`, `fd_growth`,
//! `events_lost`, `status_failures` and every sample.
//!
//! Non-goals: pass/fail thresholds (the tests assert; this reports), and
//! history or comparison between runs.

pub mod anchor;
mod bpfvm;
mod calls;
pub mod cases;
pub mod concurrency;
pub mod cpu_bound;
pub mod frames;
pub mod host;
pub mod insns;
pub mod isolation;
mod loaded;
pub mod matrix;
mod measure;
pub mod multiqueue;
pub mod overhead;
pub mod scale;
pub mod timed;
pub mod vm;

use std::{path::PathBuf, time::Duration};

use anyhow::{Context, Result};
use serde_json::{Value, json};

use crate::{duration::parse_duration, rate::Rate};

/// Identifies the JSON layout; bumped when a key changes meaning.
pub const SCHEMA: &str = "shaper-bench/1";

/// Arguments of `shaper bench`.
#[derive(Debug, clap::Args)]
#[command(after_help = crate::duration::DURATION_HELP)]
pub struct BenchArgs {
    /// Also write the results as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Run the lab part (namespaces, CAKE, netem; needs a full kernel such
    /// as the VM's) instead of the BPF_PROG_TEST_RUN part.
    #[arg(long)]
    pub vm_part: bool,
    /// Add the lab part's JSON in FILE to the host part's JSON in --json
    /// under `vm`, and print its table. Runs nothing.
    #[arg(
        long,
        value_name = "FILE",
        requires = "json",
        conflicts_with = "vm_part"
    )]
    pub merge_vm: Option<PathBuf>,
    /// Host part: distinct flows in the flow mixes.
    #[arg(long, value_name = "N", default_value_t = 10_000)]
    pub flows: u32,
    /// Host part: rounds over all flows; the own costs side by side take
    /// twice as many and one more.
    #[arg(long, value_name = "N", default_value_t = 5)]
    pub rounds: u32,
    /// Lab part: the shaping rate.
    #[arg(long, value_name = "RATE", default_value = "50mbit")]
    pub rate: Rate,
    /// Lab part: measured time per run (after a 2 s warm-up).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_measured)]
    pub duration: Duration,
    /// Lab part: the delay netem adds to the client's path, the round
    /// trip's base, for the upload and download states and the traffic
    /// cases beside them (the framing, isolation, CPU-bound and matrix
    /// parts keep their own). At most 1s.
    #[arg(long, value_name = "DURATION", default_value = "20ms", value_parser = parse_delay)]
    pub delay: Duration,
    /// Lab part: skip the aggregate pacer.
    #[arg(long)]
    pub no_aggregate: bool,
    /// Lab part: skip the download (ingress) states.
    #[arg(long)]
    pub no_ingress: bool,
    /// Lab part: repetitions of each traffic case (a lone flow on each
    /// path, a bulk flow beside sparse flows, 64 and 256 flows, unequal
    /// flows; flows that leave, join and churn), each under CAKE and the
    /// shaper; 0 skips them.
    #[arg(long, value_name = "N", default_value_t = 3)]
    pub case_reps: u32,
    /// Lab part: runs of each state (the upload and download states, each
    /// with its paced baseline), interleaved, reported as medians with
    /// their spread.
    #[arg(long, value_name = "N", default_value_t = 3,
          value_parser = clap::value_parser!(u32).range(1..=20))]
    pub state_reps: u32,
    /// Lab part: the rate of the CPU-bound case, meant to be more than the
    /// guest can shape at full speed: none, CAKE and the shaper, each
    /// shaping both directions, an upload and a download with ping,
    /// --state-reps times.
    #[arg(long, value_name = "RATE", default_value = "400mbit")]
    pub cpu_bound_rate: Rate,
    /// Lab part: skip the CPU-bound case.
    #[arg(long, conflicts_with = "cpu_bound_rate")]
    pub no_cpu_bound: bool,
    /// Lab part: also run the matrix of rates (20, 50, 200 Mbit/s), RTTs
    /// (20, 80 ms), GSO on and off and 1, 2, 4 and 16 flows, each under
    /// CAKE and the shaper, --case-reps times (a quarter of an hour or more
    /// per repetition under emulation).
    #[arg(long)]
    pub matrix: bool,
    /// Lab part: run only the soak, DURATION of flows that start and end
    /// throughout under the shaper (10m when no DURATION is given), with
    /// the controller's memory, descriptors, lost records and `status`
    /// sampled every second.
    #[arg(
        long,
        value_name = "DURATION",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "10m",
        value_parser = parse_duration,
        requires = "vm_part"
    )]
    pub soak: Option<Duration>,
    /// Lab part: run only the multi-queue and DiffServ cases, --case-reps
    /// rounds (cake_mq where the kernel has it, Linux 7.0 and later).
    #[arg(long, requires = "vm_part", conflicts_with = "soak")]
    pub multiqueue: bool,
    /// Run only the telemetry scale part (the host part runs it in a child
    /// process of its own, so its RSS is the controller's alone).
    #[arg(long, conflicts_with_all = ["vm_part", "merge_vm"])]
    pub scale_part: bool,
    /// Scale part: distinct active flows.
    #[arg(long, value_name = "N", default_value_t = 100_000)]
    pub scale_flows: u32,
    /// Scale part: packets per flow.
    #[arg(long, value_name = "N", default_value_t = 10)]
    pub scale_rounds: u32,
}

/// The longest `--delay`: beyond a second TCP's start-up alone outlasts a
/// run.
const MAX_DELAY: Duration = Duration::from_secs(1);

/// Parses `--delay`: a duration of at most [`MAX_DELAY`].
fn parse_delay(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d > MAX_DELAY {
        return Err(format!(
            "{s} is more than {}s: give a round-trip delay of at most 1s, such as 80ms",
            MAX_DELAY.as_secs()
        ));
    }
    Ok(d)
}

/// Parses `--duration`: at least a second, so that a run measures
/// something after its warm-up.
fn parse_measured(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d < Duration::from_secs(1) {
        return Err(format!(
            "{s} is less than 1s: give a measured time of a second or more, such as 10s"
        ));
    }
    Ok(d)
}

/// Runs `shaper bench`.
pub fn run(args: BenchArgs) -> Result<()> {
    if let Some(vm_file) = &args.merge_vm {
        let Some(json) = &args.json else {
            anyhow::bail!("--merge-vm needs --json FILE (the host part's results)");
        };
        return merge(json, vm_file);
    }
    if args.vm_part {
        vm::check_kernel(args.soak.is_some())?;
    }
    let doc = if args.scale_part {
        let opts = scale::ScaleOptions {
            flows: args.scale_flows,
            rounds: args.scale_rounds,
            ..scale::ScaleOptions::default()
        };
        let report = scale::run(&opts).context("the scale part failed")?;
        let doc = serde_json::to_value(&report)?;
        print!("{}", scale_table(&doc));
        doc
    } else if let (true, Some(length)) = (args.vm_part, args.soak) {
        let bin = std::env::current_exe().context("cannot find this binary's path")?;
        let report = vm::soak(&bin, args.rate, length).context("the soak failed")?;
        let mut doc = serde_json::to_value(&report)?;
        if let Value::Object(map) = &mut doc {
            map.insert("schema".to_owned(), json!(SCHEMA));
        }
        print!("{}", vm_table(&doc));
        doc
    } else if args.vm_part && args.multiqueue {
        let opts = multiqueue::MqOptions {
            bin: std::env::current_exe().context("cannot find this binary's path")?,
            rate: args.rate,
            duration: Duration::from_secs(5),
            reps: args.case_reps.max(1),
        };
        let report = multiqueue::run(&opts).context("the multi-queue part failed")?;
        let mut doc = serde_json::to_value(&report)?;
        if let Value::Object(map) = &mut doc {
            map.insert("schema".to_owned(), json!(SCHEMA));
        }
        print!("{}", multiqueue::table(&doc));
        doc
    } else if args.vm_part {
        let opts = vm::VmOptions {
            bin: std::env::current_exe().context("cannot find this binary's path")?,
            rate: args.rate,
            delay: args.delay,
            streams: 4,
            duration: args.duration,
            aggregate: !args.no_aggregate,
            ingress: !args.no_ingress,
            case_reps: args.case_reps,
            case_duration: Duration::from_secs(5),
            matrix: args.matrix,
            state_reps: args.state_reps,
            cpu_bound: (!args.no_cpu_bound).then_some(args.cpu_bound_rate),
        };
        let report = vm::run(&opts).context("the lab part failed")?;
        let mut doc = serde_json::to_value(&report)?;
        // The guest's kernel may allow the tracing programs the host's
        // refuses; the count is exact under emulation too.
        let count = host::count_helpers(&host::HostOptions::default())
            .context("counting helper calls in the lab part")?;
        if let Value::Object(map) = &mut doc {
            map.insert("helper_calls".to_owned(), serde_json::to_value(&count)?);
        }
        print!("{}", vm_table(&doc));
        doc
    } else {
        let opts = host::HostOptions {
            flows: args.flows,
            rounds: args.rounds,
            anchor_rounds: args.rounds.saturating_mul(2).saturating_add(1),
            ..host::HostOptions::default()
        };
        let report = host::run(&opts)?;
        let mut doc = serde_json::to_value(&report)?;
        let scale = scale_in_child(&args).context("the telemetry scale part failed")?;
        if let Value::Object(map) = &mut doc {
            map.insert("schema".to_owned(), json!(SCHEMA));
            map.insert("units".to_owned(), units());
            map.insert("telemetry_scale".to_owned(), scale.clone());
            map.insert("vm".to_owned(), Value::Null);
        }
        print!("{}", host_table(&doc));
        print!("{}", scale_table(&scale));
        doc
    };
    if let Some(path) = &args.json {
        write_json(path, &doc)?;
    }
    Ok(())
}

/// Runs `shaper bench --scale-part` in a child process and returns its
/// JSON document.
fn scale_in_child(args: &BenchArgs) -> Result<Value> {
    let exe = std::env::current_exe().context("cannot find this binary's path")?;
    let out = std::env::temp_dir().join(format!("shaper-scale-{}.json", std::process::id()));
    let status = std::process::Command::new(&exe)
        .args(["bench", "--scale-part", "--json"])
        .arg(&out)
        .args(["--scale-flows", &args.scale_flows.to_string()])
        .args(["--scale-rounds", &args.scale_rounds.to_string()])
        .stdout(std::process::Stdio::null())
        .status()
        .with_context(|| format!("cannot run {}", exe.display()))?;
    if !status.success() {
        anyhow::bail!("`shaper bench --scale-part` exited with {status}");
    }
    let text =
        std::fs::read_to_string(&out).with_context(|| format!("cannot read {}", out.display()))?;
    let _ = std::fs::remove_file(&out);
    serde_json::from_str(&text).with_context(|| format!("{} is not JSON", out.display()))
}

/// The scale part's table.
fn scale_table(doc: &Value) -> String {
    let u = |k: &str| doc.get(k).and_then(Value::as_u64).unwrap_or(0);
    format!(
        "telemetry scale: {} flows, {} packets, 1 in {} sampled: {} records sent, {} received \
         ({} /s), lost {} in the kernel and {} in the controller; {} flows tracked, {} with \
         histograms; RSS {} MiB (peak {} MiB, {} MiB before driving)\n",
        u("flows"),
        u("packets"),
        u("sample_every"),
        u("records_sent"),
        u("records_received"),
        num(doc, "records_per_s"),
        u("records_lost_kernel"),
        u("records_lost_user"),
        u("flows_tracked"),
        u("flow_histograms"),
        num(doc, "rss_mib"),
        num(doc, "peak_rss_mib"),
        num(doc, "rss_before_mib"),
    )
}

/// The soak's table.
fn soak_table(vm: &Value) -> String {
    let Some(s) = vm.get("soak").filter(|s| !s.is_null()) else {
        return String::new();
    };
    let u = |k: &str| s.get(k).map(Value::to_string).unwrap_or_default();
    format!(
        "soak: {} flows in {} s, goodput {}; after the warm-up ({} samples) RSS {} KiB \
         (largest drift {}), descriptors {:+}, events lost {}, status failures {}\n",
        u("flows"),
        num(s, "length_s"),
        frac(s, "goodput_ratio"),
        u("judged_samples"),
        u("rss_median_kib"),
        frac(s, "rss_drift"),
        s.get("fd_growth").and_then(Value::as_i64).unwrap_or(0),
        u("events_lost"),
        u("status_failures"),
    )
}

/// What each figure is in.
fn units() -> Value {
    json!({
        "ns_per_packet": "nanoseconds per packet, the kernel's BPF_PROG_TEST_RUN duration \
                          (median over samples)",
        "verdicts": "fraction of the measured packets whose outcome counter moved",
        "rate_bytes_per_s": "bytes per second",
        "vm.goodput_ratio": "receiver goodput / configured rate",
        "vm.ping_ms": "milliseconds, RTT under load",
        "vm.softirq_cpu_per_mbit": "percent of one CPU per Mbit/s of goodput: \
                                    (system+softirq+irq share shaped - share of an unshaped \
                                    iperf3-paced run at the same goodput) x CPUs x 100 / Mbit/s",
        "vm.cpu_bound": "receiver goodput in Mbit/s and ping p99 in ms per direction; \
                         shaper_*_goodput_ratio: the shaper's goodput / rate; \
                         shaper_*_ping_p99_vs_cake: the shaper's ping p99 / CAKE's",
        "vm.bpf_run_ns_per_packet": "nanoseconds per program run, the kernel's own \
                                     run_time_ns / run_cnt of the shaper's programs over the \
                                     state's run (BPF_ENABLE_STATS held by the bench)",
    })
}

fn write_json(path: &PathBuf, doc: &Value) -> Result<()> {
    let text = serde_json::to_string_pretty(doc)?;
    std::fs::write(path, text + "\n").with_context(|| format!("cannot write {}", path.display()))
}

/// Adds the lab part in `vm_file` to the document in `json` under `vm`.
fn merge(json: &PathBuf, vm_file: &PathBuf) -> Result<()> {
    let read = |p: &PathBuf| -> Result<Value> {
        let text =
            std::fs::read_to_string(p).with_context(|| format!("cannot read {}", p.display()))?;
        serde_json::from_str(&text).with_context(|| format!("{} is not JSON", p.display()))
    };
    let mut doc = read(json)?;
    let vm = read(vm_file)?;
    let Value::Object(map) = &mut doc else {
        anyhow::bail!("{} does not hold a JSON object", json.display());
    };
    if vm.get("part").and_then(Value::as_str) == Some(multiqueue::PART) {
        // The multi-queue part joins whatever lab part is there already.
        print!("{}", multiqueue::table(&vm));
        let into = map.entry("vm").or_insert(Value::Null);
        if !into.is_object() {
            *into = json!({});
        }
        if let Value::Object(into) = into {
            for key in ["multiqueue", "diffserv"] {
                into.insert(key.to_owned(), vm.get(key).cloned().unwrap_or(Value::Null));
            }
        }
        return write_json(json, &doc);
    }
    print!("{}", vm_table(&vm));
    adopt_helper_count(map, &vm);
    map.insert("vm".to_owned(), vm);
    write_json(json, &doc)
}

/// Where the host part could not count helper calls, takes the lab part's
/// count, naming its kernel in `helper_calls_kernel`.
fn adopt_helper_count(host: &mut serde_json::Map<String, Value>, vm: &Value) {
    let counted_here = host
        .get("helper_calls_per_packet")
        .is_some_and(|v| !v.is_null());
    let Some(count) = vm.get("helper_calls") else {
        return;
    };
    if counted_here
        || count
            .get("helper_calls_per_packet")
            .is_none_or(Value::is_null)
    {
        return;
    }
    for key in ["helper_calls_per_packet", "helper_calls"] {
        if let Some(v) = count.get(key) {
            host.insert(key.to_owned(), v.clone());
        }
    }
    if let Some(k) = count.get("kernel_release") {
        host.insert("helper_calls_kernel".to_owned(), k.clone());
    }
}

fn num(v: &Value, key: &str) -> String {
    match v.get(key).and_then(Value::as_f64) {
        Some(x) => format!("{x:.1}"),
        None => "-".to_owned(),
    }
}

fn frac(v: &Value, key: &str) -> String {
    match v.get(key).and_then(Value::as_f64) {
        Some(x) => format!("{:.1}%", x * 100.0),
        None => "-".to_owned(),
    }
}

/// `median [min–max]` of the figure `median_key`, its spread read from
/// `spread_key` (absent in a single run's document: the median alone), each
/// number through `show`.
fn with_range(st: &Value, median_key: &str, spread_key: &str, show: fn(f64) -> String) -> String {
    let Some(m) = st.get(median_key).and_then(Value::as_f64) else {
        return "-".to_owned();
    };
    let spread = st.get(spread_key).filter(|v| !v.is_null());
    let bound = |k: &str| spread.and_then(|v| v.get(k)).and_then(Value::as_f64);
    match (bound("min"), bound("max")) {
        (Some(lo), Some(hi)) => format!("{} [{}–{}]", show(m), show(lo), show(hi)),
        _ => show(m),
    }
}

/// One state's row of the lab table: medians, and the spread of goodput,
/// ping p99 and CPU over the state's runs.
fn state_row(name: &str, st: &Value) -> String {
    format!(
        "  {:<12} {:>20} {:>9} {:>18} {:>20} {:>10}\n",
        name,
        with_range(st, "goodput_ratio", "goodput", |x| format!(
            "{:.1}%",
            x * 100.0
        )),
        num(st, "ping_p50_ms"),
        with_range(st, "ping_p99_ms", "ping_p99", |x| format!("{x:.1}")),
        with_range(st, "softirq_cpu_per_mbit", "cpu", |x| format!("{x:.3}")),
        num(st, "bpf_run_ns_per_packet"),
    )
}

/// The interpreter's counts on the paced mix, as a line of the host table.
fn insns_line(doc: &Value) -> String {
    let insns = doc.get("bpf_insns").unwrap_or(&Value::Null);
    let path = |name: &str, key: &str| {
        insns
            .get("paths")
            .and_then(|p| p.get(name))
            .map_or_else(|| "-".to_owned(), |p| num(p, key))
    };
    format!(
        "  BPF instructions per packet (10k-flow mix, paced, interpreted) fair pacer {} \
         ({} helper calls), aggregate pacer {} ({})\n",
        num(insns, "pacer_insns_per_packet"),
        path("flow_mix_10k", "helper_calls_per_packet"),
        num(insns, "aggregate_insns_per_packet"),
        path("aggregate_flow_mix_10k", "helper_calls_per_packet"),
    )
}

/// The host part as a table.
fn host_table(doc: &Value) -> String {
    let mut s = format!(
        "shaper bench (BPF_PROG_TEST_RUN), kernel {}, {}, load average {}\n",
        doc.get("kernel_release")
            .and_then(Value::as_str)
            .unwrap_or("?"),
        doc.get("cpu_model").and_then(Value::as_str).unwrap_or("?"),
        num(doc, "load_average_1m"),
    );
    s.push_str(&format!(
        "  classifier (10k-flow mix, paced) {:>7} ns/pkt   passthrough {:>6} ns/pkt   \
         pacer {:>6} ns/pkt\n",
        num(doc, "classifier_ns_per_packet"),
        num(doc, "passthrough_ns_per_packet"),
        num(doc, "pacer_ns_per_packet")
    ));
    s.push_str(&format!(
        "  aggregate pacer (same mix, paced) {:>7} ns/pkt   own cost {:>6} ns/pkt   fair pacer's \
         own cost {:>6} ns/pkt, {}× the aggregate's\n",
        num(doc, "aggregate_ns_per_packet"),
        num(doc, "aggregate_own_ns"),
        num(doc, "pacer_own_ns"),
        num(doc, "own_cost_ratio"),
    ));
    s.push_str(&format!(
        "  one clock read (same mix) {:>7} ns/pkt, in both own costs\n",
        num(doc, "clock_read_ns"),
    ));
    if let Some(o) = doc.get("own_costs").filter(|o| !o.is_null()) {
        let range = |key: &str| match o.get(key) {
            Some(r) => format!("{} [{}–{}]", num(r, "median"), num(r, "min"), num(r, "max")),
            None => "-".to_owned(),
        };
        s.push_str(&format!(
            "  own costs over {} rounds side by side, median [min–max]: fair pacer {} ns/pkt, \
             aggregate pacer {} ns/pkt, ratio {}\n",
            o.get("rounds")
                .and_then(Value::as_u64)
                .map_or_else(|| "-".to_owned(), |n| n.to_string()),
            range("pacer_own_ns"),
            range("aggregate_own_ns"),
            range("own_cost_ratio"),
        ));
    }
    s.push_str(&format!(
        "  ingress policer (10k-flow mix, overloaded) {:>7} ns/pkt\n",
        num(doc, "police_ns_per_packet")
    ));
    s.push_str(&match doc.get("concurrency").filter(|c| !c.is_null()) {
        Some(c) => format!(
            "  fair pacer (10k-flow mix, paced) from one CPU {:>7} ns/pkt, from two at once \
             {:>7} ns/pkt, {}×\n",
            num(c, "ns_per_packet_1cpu"),
            num(c, "ns_per_packet_2cpu"),
            c.get("ratio")
                .and_then(Value::as_f64)
                .map_or_else(|| "-".to_owned(), |r| format!("{r:.2}")),
        ),
        None => "  fair pacer from two CPUs at once: not measured (one CPU)\n".to_owned(),
    });
    s.push_str(
        &match doc.get("helper_calls_per_packet").and_then(Value::as_f64) {
            Some(n) => format!("  helper calls per packet (10k-flow mix, paced) {n:.2}\n"),
            None => format!(
                "  helper calls per packet: not counted ({})\n",
                doc.get("helper_calls_error")
                    .and_then(Value::as_str)
                    .unwrap_or("no reason given")
            ),
        },
    );
    s.push_str(&insns_line(doc));
    if let Some(programs) = doc.get("programs").and_then(Value::as_object) {
        for (name, p) in programs {
            s.push_str(&format!(
                "  {name:<22} {:>6} insns after the verifier's rewrites, {:>8} verified of 1000000\n",
                p.get("xlated_insns").and_then(Value::as_u64).unwrap_or(0),
                p.get("verified_insns").and_then(Value::as_u64).unwrap_or(0),
            ));
        }
    }
    s.push_str(&format!(
        "  {:<22} {:>8} {:>8} {:>8} {:>6} {:>8} {:>9} {:>8}\n",
        "path", "ns/pkt", "min", "pass", "flows", "repeat", "intended", "fraction"
    ));
    if let Some(paths) = doc.get("paths").and_then(Value::as_object) {
        for (name, p) in paths {
            s.push_str(&format!(
                "  {:<22} {:>8} {:>8} {:>8} {:>6} {:>8} {:>9} {:>8}\n",
                name,
                num(p, "ns_per_packet"),
                num(p, "ns_per_packet_min"),
                num(p, "passthrough_ns_per_packet"),
                p.get("flows").and_then(Value::as_u64).unwrap_or(0),
                p.get("repeat").and_then(Value::as_u64).unwrap_or(0),
                p.get("intended").and_then(Value::as_str).unwrap_or("?"),
                frac(p, "intended_fraction"),
            ));
        }
    }
    s
}

/// The lab part as a table (a soak's document holds only the soak).
fn vm_table(vm: &Value) -> String {
    if vm.get("soak").is_some() {
        return soak_table(vm);
    }
    let mut s = format!(
        "shaper bench (lab), kernel {}, {} Mbit/s, +{} ms RTT, {} TCP streams, {} s\n",
        vm.get("kernel_release")
            .and_then(Value::as_str)
            .unwrap_or("?"),
        num(vm, "rate_mbit"),
        num(vm, "delay_ms"),
        vm.get("streams").and_then(Value::as_u64).unwrap_or(0),
        num(vm, "duration_s"),
    );
    s.push_str(&format!(
        "  {:<12} {:>20} {:>9} {:>18} {:>20} {:>10}\n",
        "state", "goodput", "ping p50", "ping p99", "cpu %/Mbit/s", "bpf ns/pkt"
    ));
    for name in ["shaper", "cake", "aggregate"] {
        if let Some(st) = vm.get(name).filter(|v| !v.is_null()) {
            s.push_str(&state_row(name, st));
        }
    }
    if let Some(ing) = vm.get("ingress").filter(|v| !v.is_null()) {
        s.push_str("  download, shaped at the WAN ingress:\n");
        for name in ["police", "ifb", "cake_ingress", "ifb_alone"] {
            if let Some(st) = ing.get(name) {
                s.push_str(&state_row(name, st));
            }
        }
    }
    if vm.get("lone_flow").is_some() {
        s.push_str(&cases::table(vm));
    }
    if vm.get("churn").is_some() {
        s.push_str(&timed::table(vm));
    }
    if let Some(o) = vm.get("overhead").filter(|o| !o.is_null()) {
        s.push_str(&overhead::table(o));
    }
    if let Some(i) = vm.get("isolation").filter(|i| !i.is_null()) {
        s.push_str(&isolation::table(i));
    }
    if let Some(m) = vm.get("matrix").filter(|m| !m.is_null()) {
        s.push_str(&matrix::table(m));
    }
    if let Some(c) = vm.get("cpu_bound").filter(|c| !c.is_null()) {
        s.push_str(&cpu_bound::table(c));
    }
    for w in vm
        .get("warnings")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
    {
        s.push_str(&format!("  warning: {w}\n"));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_tolerate_missing_fields() {
        let host = json!({"kernel_release": "6.18", "paths": {"paced": {"ns_per_packet": 70.24}}});
        let t = host_table(&host);
        assert!(t.contains("paced") && t.contains("70.2"), "{t}");
        let vm = json!({"shaper": {"goodput_ratio": 0.95}, "aggregate": null});
        let t = vm_table(&vm);
        assert!(t.contains("95.0%") && !t.contains("aggregate"), "{t}");
    }

    #[test]
    fn the_host_table_shows_the_own_costs_rounds_with_their_spread() {
        let r = |median, min, max| anchor::Rounds { median, min, max };
        let own = anchor::AnchorReport {
            rounds: 11,
            pacer_own_ns: r(90.0, 85.5, 99.0),
            aggregate_own_ns: r(64.0, 60.0, 70.0),
            own_cost_ratio: r(1.4, 1.3, 1.5),
            ..anchor::AnchorReport::default()
        };
        let doc = json!({"own_costs": serde_json::to_value(&own).expect("serializes")});
        let t = host_table(&doc);
        assert!(
            t.contains("over 11 rounds")
                && t.contains("fair pacer 90.0 [85.5–99.0]")
                && t.contains("aggregate pacer 64.0 [60.0–70.0]")
                && t.contains("ratio 1.4 [1.3–1.5]"),
            "{t}"
        );
    }

    #[derive(Debug, clap::Parser)]
    struct Args {
        #[command(flatten)]
        bench: BenchArgs,
    }

    #[test]
    fn the_cpu_bound_case_runs_at_400mbit_unless_told_otherwise() {
        use clap::Parser;
        let parse = |args: &[&str]| {
            Args::try_parse_from(std::iter::once("bench").chain(args.iter().copied()))
                .map(|a| a.bench)
        };
        let a = parse(&["--vm-part"]).expect("defaults");
        assert_eq!(a.cpu_bound_rate.bits_per_s(), 400_000_000);
        assert!(!a.no_cpu_bound);
        let a = parse(&["--vm-part", "--cpu-bound-rate", "300mbit"]).expect("a rate");
        assert_eq!(a.cpu_bound_rate.bits_per_s(), 300_000_000);
        assert!(
            parse(&["--vm-part", "--no-cpu-bound"])
                .expect("skipped")
                .no_cpu_bound
        );
        let err = parse(&["--no-cpu-bound", "--cpu-bound-rate", "300mbit"])
            .expect_err("a rate for a skipped case");
        assert_eq!(err.exit_code(), 2);
        let err = parse(&["--cpu-bound-rate", "400"]).expect_err("a bare number");
        assert_eq!(err.exit_code(), 2);
    }

    #[test]
    fn the_delay_defaults_to_20ms_and_is_bounded() {
        use clap::Parser;
        let parse = |args: &[&str]| {
            Args::try_parse_from(std::iter::once("bench").chain(args.iter().copied()))
                .map(|a| a.bench)
        };
        assert_eq!(
            parse(&["--vm-part"]).expect("defaults").delay,
            Duration::from_millis(20)
        );
        assert_eq!(
            parse(&["--vm-part", "--delay", "80ms"])
                .expect("80 ms")
                .delay,
            Duration::from_millis(80)
        );
        for bad in ["2s", "80"] {
            let err = parse(&["--vm-part", "--delay", bad]).expect_err(bad);
            assert_eq!(err.exit_code(), 2, "{bad}");
        }
    }

    #[test]
    fn the_lab_table_shows_the_cpu_bound_case_when_it_ran() {
        let ran = json!({"cpu_bound": {
            "rate_mbit": 400.0, "state_reps": 3,
            "shaper": {"up_goodput_mbit": 320.0, "down_goodput_mbit": 350.0},
            "shaper_up_goodput_ratio": 0.8,
        }});
        let t = vm_table(&ran);
        assert!(t.contains("CPU-bound rate, 400.0 Mbit/s"), "{t}");
        assert!(
            t.contains("320.0") && t.contains("80.0% of the rate up"),
            "{t}"
        );
        let t = vm_table(&json!({"cpu_bound": null}));
        assert!(!t.contains("CPU-bound"), "{t}");
    }

    #[test]
    fn a_state_row_shows_medians_with_their_range() {
        let st = json!({
            "goodput_ratio": 0.95, "goodput": {"median": 0.95, "min": 0.93, "max": 0.96},
            "ping_p99_ms": 22.5, "ping_p99": {"median": 22.5, "min": 21.0, "max": 30.25},
            "softirq_cpu_per_mbit": 0.9, "cpu": null,
        });
        let row = state_row("shaper", &st);
        assert!(row.contains("95.0% [93.0%–96.0%]"), "{row}");
        assert!(row.contains("22.5 [21.0–30.2]"), "{row}");
        assert!(row.contains("0.900") && !row.contains("0.900 ["), "{row}");
    }

    #[test]
    fn a_refused_host_count_takes_the_guests_and_a_host_count_stays() {
        let vm = json!({"helper_calls": {
            "kernel_release": "6.12",
            "helper_calls_per_packet": 1.0,
            "helper_calls": {"flow_mix_10k": {"bpf_ktime_get_ns": 1.0}},
            "helper_calls_error": null,
        }});
        let mut refused = json!({"helper_calls_per_packet": null, "helper_calls_error": "EPERM"});
        let map = refused.as_object_mut().expect("object");
        adopt_helper_count(map, &vm);
        assert_eq!(map["helper_calls_per_packet"], json!(1.0));
        assert_eq!(map["helper_calls_kernel"], json!("6.12"));
        assert_eq!(
            map["helper_calls"]["flow_mix_10k"]["bpf_ktime_get_ns"],
            json!(1.0)
        );

        let mut counted = json!({"helper_calls_per_packet": 2.0});
        let map = counted.as_object_mut().expect("object");
        adopt_helper_count(map, &vm);
        assert_eq!(map["helper_calls_per_packet"], json!(2.0));
        assert!(!map.contains_key("helper_calls_kernel"));
    }

    /// The lab part replaces `vm`; the multi-queue part merged after it
    /// joins it, keeping what is there.
    #[test]
    fn the_multiqueue_part_joins_the_lab_part() {
        let dir = std::env::temp_dir().join(format!("shaper-merge-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("tmp");
        let (doc, lab, mq) = (
            dir.join("doc.json"),
            dir.join("lab.json"),
            dir.join("mq.json"),
        );
        let write = |p: &PathBuf, v: Value| std::fs::write(p, v.to_string()).expect("write");
        write(&doc, json!({"schema": SCHEMA, "vm": null}));
        write(&lab, json!({"shaper": {"goodput_ratio": 0.9}}));
        write(
            &mq,
            json!({"part": multiqueue::PART, "multiqueue": {"queues": 4},
                   "diffserv": {"cake": {"ef_bulk_share": 0.24}}}),
        );
        merge(&doc, &lab).expect("lab part");
        merge(&doc, &mq).expect("multi-queue part");
        let v: Value =
            serde_json::from_str(&std::fs::read_to_string(&doc).expect("read")).expect("json");
        assert_eq!(v["vm"]["shaper"]["goodput_ratio"], json!(0.9));
        assert_eq!(v["vm"]["multiqueue"]["queues"], json!(4));
        assert_eq!(v["vm"]["diffserv"]["cake"]["ef_bulk_share"], json!(0.24));
        // Alone, it makes `vm` an object of its own.
        write(&doc, json!({"vm": null}));
        merge(&doc, &mq).expect("multi-queue part alone");
        let v: Value =
            serde_json::from_str(&std::fs::read_to_string(&doc).expect("read")).expect("json");
        assert_eq!(v["vm"]["multiqueue"]["queues"], json!(4));
        let _ = std::fs::remove_dir_all(&dir);
    }
}

//! The subcommands: validate, check, act. Errors carry the domain error types
//! so `main` can tell usage errors (exit 2) from failures (exit 1).

use anyhow::{Context, Result};
use tokio::signal::unix::{SignalKind, signal};
use tracing::{info, warn};

use crate::{
    attach,
    checks::{self, Capabilities, CheckError},
    cli::{ConfigCommand, RunArgs},
    config::RunPlan,
    config_file::ConfigFile,
    hook::AttachError,
    ingress::{self, IngressMode},
    link::{Link, link_by_name},
    nat,
    state::{self, Paths, Record, Roots},
    status, tc,
    telemetry::{self, Output, Pipeline, PipelineOptions},
    undo,
};

/// Undoes on drop unless disarmed, so even a panic or an early return after
/// attaching restores the interface.
struct UndoGuard {
    armed: Option<(Record, Paths)>,
}

impl UndoGuard {
    fn undo_now(&mut self) -> Result<(), AttachError> {
        match self.armed.take() {
            Some((record, paths)) => undo::undo(&record, &paths),
            None => Ok(()),
        }
    }
}

impl Drop for UndoGuard {
    fn drop(&mut self) {
        if let Err(e) = self.undo_now() {
            warn!(error = %e, "restoring the interface failed; run `shaper cleanup`");
        }
    }
}

/// Checks that `link` carries no shaper already.
fn check_not_shaped(link: &Link, paths: &Paths) -> Result<()> {
    if let Some(rec) = Record::load(&paths.record)? {
        return Err(CheckError::AlreadyShaped {
            iface: link.name.clone(),
            pid: rec.pid,
            state: if state::pid_alive(rec.pid) {
                "running"
            } else {
                "no longer running"
            },
        }
        .into());
    }
    if tc::is_shaper_root(link.ifindex)? {
        return Err(CheckError::ForeignShaperRoot {
            iface: link.name.clone(),
        }
        .into());
    }
    Ok(())
}

/// `shaper run`.
pub fn run(args: RunArgs) -> Result<()> {
    let RunPlan {
        mut egress,
        mut ingress,
    } = args.plan()?;
    Capabilities::current()?.check()?;
    let link = link_by_name(&args.iface)?;
    checks::check_link(&link)?;
    let netns = state::current_netns()?;
    let paths = Roots::default().paths(&link.name, netns);
    check_not_shaped(&link, &paths)?;
    let lans = nat::check_lans(&args.lans, &link.name)?;
    let nat_map = args.nat.then(|| crate::pins::nat_map(&paths));
    for c in egress.iter_mut().chain(ingress.iter_mut()) {
        c.nat_map.clone_from(&nat_map);
    }
    let ifb = ingress
        .as_ref()
        .filter(|_| args.ingress_mode == IngressMode::Ifb);
    checks::check_kernel(egress.as_ref(), ifb)?;
    if link.oper_state == "down" || link.oper_state == "lowerlayerdown" {
        warn!(iface = %link.name, state = %link.oper_state, "the interface has no carrier; shaping anyway");
    }
    // The last check: the metrics address is bound before anything changes.
    let mut metrics = match args.metrics {
        Some(addr) if egress.is_some() && !args.no_telemetry => {
            Some(telemetry::metrics::bind(addr)?)
        }
        _ => None,
    };

    // The objects, before the first change: the ingress side's on a thread
    // of its own beside the egress pacer's, each under its own verifier run.
    let (egress_object, ingress_objects) = std::thread::scope(|scope| {
        let ingress_objects = ingress
            .as_ref()
            .map(|c| scope.spawn(|| ingress::preload(c, args.ingress_mode, link.has_l2_header)));
        let egress_object = egress
            .as_ref()
            .and_then(|c| attach::preload(c, link.has_l2_header))
            .transpose();
        let ingress_objects = ingress_objects.and_then(|t| {
            t.join().unwrap_or_else(|_| {
                Some(Err(AttachError::Load {
                    detail: "the thread loading the ingress objects panicked".into(),
                }))
            })
        });
        (egress_object, ingress_objects.transpose())
    });
    let (mut egress_object, mut ingress_objects) = (egress_object?, ingress_objects?);

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")?;
    runtime.block_on(async {
        // Handlers first: a signal during attach is held until we can undo.
        let mut sigterm = signal(SignalKind::terminate()).context("installing SIGTERM handler")?;
        let mut sigint = signal(SignalKind::interrupt()).context("installing SIGINT handler")?;
        let mut sighup = signal(SignalKind::hangup()).context("installing SIGHUP handler")?;

        let mut shaped = match &egress {
            Some(config) => Some(attach::attach(
                config,
                &link,
                paths.clone(),
                egress_object.take(),
            )?),
            None => None,
        };
        let mut guard = UndoGuard {
            armed: shaped.as_ref().map(|s| (s.record.clone(), s.paths.clone())),
        };
        let policer = match &ingress {
            Some(config) => {
                let record = shaped.as_ref().map(|s| s.record.clone());
                let loaded = ingress_objects.take();
                match ingress::attach(config, args.ingress_mode, &link, &paths, record, loaded) {
                    Ok((ebpf, record)) => {
                        guard.armed = Some((record, paths.clone()));
                        Some(ebpf)
                    }
                    Err(e) => {
                        // ingress::attach undid everything, egress included.
                        guard.armed = None;
                        return Err(e.into());
                    }
                }
            }
            None => None,
        };
        // The LAN side of --nat, once the pacers that read its map are in
        // place; a failure is undone by the guard, whose record names
        // each step.
        let _lan_classifiers = match guard.armed.as_mut() {
            Some((record, paths)) if args.nat => nat::attach(&lans, paths, record)?,
            _ => Vec::new(),
        };
        // In JSON mode stdout carries only records.
        let say = |msg: String| {
            if args.json {
                eprintln!("{msg}");
            } else {
                println!("{msg}");
            }
        };
        let mut what = Vec::new();
        if let Some(c) = &egress {
            what.push(format!("egress at {}", c.rate));
        }
        if let Some(c) = &ingress {
            what.push(match args.ingress_mode {
                IngressMode::Police => format!("ingress at {} (police)", c.rate),
                IngressMode::Ifb => format!(
                    "ingress at {} (ifb: through {})",
                    c.rate,
                    crate::ifb::name_for(&link.name)
                ),
            });
        }
        say(format!(
            "{}{} {} (pid {}); Ctrl-C or SIGTERM stops and restores it",
            crate::status::READY_PREFIX,
            link.name,
            what.join(" and "),
            std::process::id()
        ));
        let pipeline = match shaped.as_mut() {
            Some(shaped) if !args.no_telemetry => {
                let fair = egress
                    .as_ref()
                    .is_some_and(|c| c.pacer.kind == crate::pacer::PacerKind::Fair);
                let (ring, counters) = telemetry::source::pacer(&mut shaped.ebpf, fair)?;
                let mut opts =
                    PipelineOptions::new(&link.name, "shaper", Output::detect(args.json));
                opts.top = args.top;
                opts.metrics = metrics.take();
                opts.table.sample_every = args.sample.max(1);
                let p = Pipeline::start(ring, counters, opts).await?;
                if let Some(addr) = p.metrics_addr {
                    say(format!("shaper: metrics at http://{addr}/metrics"));
                }
                Some(p)
            }
            _ => None,
        };
        // Until a signal, or until the interface or its root qdisc is lost.
        let owns_root = shaped.as_ref().is_some_and(|s| s.record.replaced_root);
        let mut watch = tokio::time::interval(crate::watch::WATCH_PERIOD);
        let lost = loop {
            let which = tokio::select! {
                _ = sigterm.recv() => "SIGTERM",
                _ = sigint.recv() => "SIGINT",
                _ = sighup.recv() => "SIGHUP",
                _ = watch.tick() => {
                    match crate::watch::check(&link.name, link.ifindex, owns_root) {
                        Some(lost) => break Some(lost),
                        None => continue,
                    }
                }
            };
            info!(signal = which, "stopping");
            break None;
        };
        if let Some(l) = &lost {
            warn!(iface = %link.name, "{l}; stopping");
        }
        let summary = match pipeline {
            Some(p) => Some(p.stop().await),
            None => None,
        };
        let police_counts = policer
            .as_ref()
            .filter(|_| args.ingress_mode == IngressMode::Police)
            .map(|p| ingress::counters(&p.ebpf));
        drop(shaped);
        drop(policer);
        guard.undo_now()?;
        if let Some(l) = lost {
            return Err(l.into());
        }
        say(format!("shaper: {} restored", link.name));
        if let Some(s) = summary {
            if args.json {
                println!("{}", telemetry::view::summary_json(&s));
            } else {
                print!("{}", telemetry::view::summary_text(&s));
            }
        }
        if let Some(Ok(counts)) = police_counts {
            let line = ingress::summary(&counts);
            if args.json {
                println!("{}", ingress::summary_json(&counts));
            } else {
                println!("{line}");
            }
        }
        Ok(())
    })
}

/// `shaper run --config FILE [--section NAME]`: the section's flags, after
/// every section of the file is validated.
pub fn run_from_file(file: &std::path::Path, section: Option<&str>) -> Result<()> {
    let config = ConfigFile::load(file)?;
    run(config.select(section)?.args.clone())
}

/// `shaper config`.
pub fn config(cmd: ConfigCommand) -> Result<()> {
    match cmd {
        ConfigCommand::Check { file } => {
            for s in ConfigFile::load(&file)?.enabled() {
                println!("{} {}", s.name, s.args.iface);
            }
        }
        ConfigCommand::Args {
            file,
            section,
            no_rates,
        } => {
            let config = ConfigFile::load(&file)?;
            for arg in config.select(section.as_deref())?.run_args(!no_rates) {
                println!("{arg}");
            }
        }
        ConfigCommand::ApplyRates { file, section } => {
            let config = ConfigFile::load(&file)?;
            apply_rates(&config.select(section.as_deref())?.args)?;
        }
    }
    Ok(())
}

/// `shaper config apply-rates`: each rate `args` sets, through
/// [`set_rate`], once the running shaper is known to shape each of those
/// directions, so a refusal changes nothing.
fn apply_rates(args: &RunArgs) -> Result<()> {
    let netns = state::current_netns()?;
    let paths = Roots::default().paths(&args.iface, netns);
    let not_shaped = || AttachError::NotShaped {
        iface: args.iface.clone(),
    };
    let record = Record::load(&paths.record)?.ok_or_else(not_shaped)?;
    if args.rate.is_some() && record.rate_bits_per_s == 0 {
        return Err(not_shaped().into());
    }
    if args.ingress_rate.is_some() && record.ingress.is_none() {
        return Err(AttachError::NoIngress {
            iface: args.iface.clone(),
        }
        .into());
    }
    if let Some(rate) = args.rate {
        set_rate(&args.iface, false, rate)?;
    }
    if let Some(rate) = args.ingress_rate {
        set_rate(&args.iface, true, rate)?;
    }
    Ok(())
}

/// `shaper status`.
pub fn status(iface: Option<String>, json: bool) -> Result<()> {
    let netns = state::current_netns()?;
    let list = status::collect(&Roots::default(), netns, iface.as_deref())?;
    if let (true, Some(name)) = (list.is_empty(), iface.as_deref()) {
        // A record outlives its interface (status then reports it stale), so
        // the name is looked up only when there is no record: a typo is a
        // usage error, not an unshaped interface.
        crate::link::link_by_name(name)?;
    }
    if json {
        for st in &list {
            println!("{}", status::to_json(st));
        }
        return Ok(());
    }
    if list.is_empty() {
        match iface {
            Some(i) => println!("{i}: not shaped by shaper"),
            None => println!("no interface is shaped by shaper in this network namespace"),
        }
        return Ok(());
    }
    print!("{}", status::render(&list));
    Ok(())
}

/// `shaper set-rate`: rewrites the rate in the running pacer's pinned
/// configuration map (with `ingress`, the download's: the IFB pacer's or
/// the policer's). The classifier reads it on every packet, so the new
/// rate applies from the next packet; packets already stamped leave as
/// scheduled (at most the horizon, in practice CoDel's target).
pub fn set_rate(iface: &str, ingress: bool, rate: crate::rate::Rate) -> Result<()> {
    Capabilities::current()?.check()?;
    let netns = state::current_netns()?;
    let paths = Roots::default().paths(iface, netns);
    let (old, which) = if ingress {
        (
            crate::attach::set_ingress_rate(iface, &paths, rate)?,
            "ingress",
        )
    } else {
        (crate::attach::set_rate(iface, &paths, rate)?, "egress")
    };
    let old = crate::rate::Rate::from_bits_per_s(old.saturating_mul(8))
        .map_or_else(|| format!("{old} bytes/s"), |r| r.to_string());
    println!("shaper: {iface} {which} rate {old} -> {rate}");
    Ok(())
}

/// Why cleanup refused to touch an interface.
#[derive(Debug, thiserror::Error)]
#[error(
    "'{iface}' is still shaped by a running shaper (pid {pid}): stop it with `kill {pid}`, which \
     restores the interface itself, or pass --force"
)]
pub struct StillRunning {
    iface: String,
    pid: u32,
}

/// `shaper cleanup`.
pub fn cleanup(iface: Option<String>, force: bool) -> Result<()> {
    Capabilities::current()?.check()?;
    let netns = state::current_netns()?;
    let roots = Roots::default();
    let names = match &iface {
        Some(i) => vec![i.clone()],
        None => state::recorded_ifaces(&roots, netns)?,
    };
    let mut cleaned = 0;
    for name in names {
        let paths = roots.paths(&name, netns);
        let Some(record) = Record::load(&paths.record)? else {
            println!("{name}: nothing to clean up (no state record)");
            continue;
        };
        let me = std::process::id();
        if !force
            && record.pid != me
            && state::pid_alive(record.pid)
            && is_shaper_process(record.pid)
        {
            return Err(StillRunning {
                iface: name,
                pid: record.pid,
            }
            .into());
        }
        undo::undo(&record, &paths).with_context(|| format!("cleaning up {name}"))?;
        println!("{name}: restored");
        cleaned += 1;
    }
    if iface.is_none() && cleaned == 0 {
        println!("nothing to clean up in this network namespace");
    }
    Ok(())
}

/// True when `pid` runs a program named shaper (guards against a reused pid).
fn is_shaper_process(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "shaper")
}

/// `shaper observe`: validates the flags, then hands over to
/// [`crate::observe::run`].
pub fn observe(args: crate::cli::ObserveArgs) -> Result<()> {
    let config =
        crate::observe::ObserveConfig::new(args.iface, args.duration, args.interval, args.json)?;
    crate::observe::run(config)
}

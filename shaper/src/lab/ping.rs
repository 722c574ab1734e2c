//! Latency under load: ping from a testbed host, every RTT sample kept.
//!
//! [`Ping`] runs `ping -n -i I -w SECS ADDR` on its own thread after a delay
//! (so it can start when an iperf3 run's omitted warm-up ends) and parses
//! each `time=X ms` line. Lost probes are simply missing samples; a run with
//! no reply at all is an error.
//!
//! Units: RTT samples in milliseconds, as ping prints them.
//!
//! Non-goals: loss statistics, IPv6, other probe types (TCP or UDP RTT).

use std::{
    net::Ipv4Addr,
    process::Command,
    thread::{JoinHandle, sleep},
    time::Duration,
};

use super::{
    LabError, exec,
    topology::{Host, Testbed},
};

/// A ping running on its own thread.
pub struct Ping {
    handle: JoinHandle<Result<Vec<f64>, LabError>>,
}

impl Ping {
    /// After `delay`, pings `to` from `from` every `interval` for `duration`
    /// (`ping -n -i I -w SECS`, whole seconds, rounded up). Intervals below
    /// 0.2 s need root, which the lab has.
    pub fn spawn(
        tb: &Testbed,
        from: Host,
        to: Ipv4Addr,
        interval: Duration,
        delay: Duration,
        duration: Duration,
    ) -> Self {
        Self::spawn_marked(tb, from, to, (interval, delay, duration), None)
    }

    /// As [`Ping::spawn`] (`times`: interval, delay, duration), the probes'
    /// TOS byte set to `tos` (`ping -Q`; `0xb8` is EF).
    pub fn spawn_marked(
        tb: &Testbed,
        from: Host,
        to: Ipv4Addr,
        times: (Duration, Duration, Duration),
        tos: Option<u8>,
    ) -> Self {
        let (interval, delay, duration) = times;
        let mut cmd: Command = tb.command(from, "ping");
        let secs = duration.as_secs() + u64::from(duration.subsec_nanos() > 0);
        cmd.args(["-n", "-i", &format!("{:.3}", interval.as_secs_f64())])
            .args(["-w", &secs.max(1).to_string()]);
        if let Some(tos) = tos {
            cmd.args(["-Q", &tos.to_string()]);
        }
        cmd.arg(to.to_string());
        let handle = std::thread::spawn(move || {
            sleep(delay);
            let command = exec::describe(&cmd);
            let out = cmd.output().map_err(|source| LabError::Spawn {
                command: command.clone(),
                source,
            })?;
            let text = String::from_utf8_lossy(&out.stdout);
            let samples = parse_ping(&text);
            // Exit 1 means some replies were missing: fine if others came.
            if samples.is_empty() {
                return Err(LabError::CommandFailed {
                    command,
                    status: out.status.to_string(),
                    output: format!("no replies: {text}{}", String::from_utf8_lossy(&out.stderr)),
                });
            }
            Ok(samples)
        });
        Self { handle }
    }

    /// The RTT samples, in milliseconds, in order.
    pub fn wait(self) -> Result<Vec<f64>, LabError> {
        self.handle.join().map_err(|_| LabError::Invalid {
            detail: "the ping thread panicked".to_owned(),
        })?
    }
}

/// Every `time=X ms` of ping's output, in milliseconds.
pub fn parse_ping(text: &str) -> Vec<f64> {
    text.lines()
        .filter_map(|l| {
            let rest = &l[l.find("time=")? + "time=".len()..];
            rest.split_whitespace()
                .next()?
                .trim_end_matches("ms")
                .parse()
                .ok()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ping_samples() {
        let text = "PING 10.71.3.2 (10.71.3.2) 56(84) bytes of data.\n\
64 bytes from 10.71.3.2: icmp_seq=1 ttl=63 time=21.4 ms\n\
64 bytes from 10.71.3.2: icmp_seq=2 ttl=63 time=0.539 ms\n\
From 10.71.1.1 icmp_seq=3 Destination Host Unreachable\n\
64 bytes from 10.71.3.2: icmp_seq=4 ttl=63 time=105 ms\n\
\n--- 10.71.3.2 ping statistics ---\n\
4 packets transmitted, 3 received, 25% packet loss, time 207ms\n\
rtt min/avg/max/mdev = 0.477/1.195/3.814/1.310 ms\n";
        assert_eq!(parse_ping(text), vec![21.4, 0.539, 105.0]);
        assert!(parse_ping("time=abc ms\n").is_empty());
    }
}

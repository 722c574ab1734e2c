//! The states the lab knows ([`StateKind`]), what a state shapes with
//! beyond its rate (TX queues, tins, the link's framing, host isolation),
//! and the [`State`](super::State) each kind becomes with it: CAKE's options and the shaper's
//! arguments from the same settings, so the states compare like with like.
//!
//! Non-goals: validation (`super::cli::LabConfig::from_args` refuses what a
//! kind cannot take before this runs).

use shaper_common::{hosts::Isolation, tins::Diffserv};

use crate::{pacer::FramingArgs, rate::Rate};

/// A state the lab knows, before it is bound to a rate and a binary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StateKind {
    /// No shaping.
    None,
    /// CAKE, besteffort.
    Cake,
    /// HTB + fq_codel.
    FqCodel,
    /// This project's `shaper run` on egress and on ingress in the default
    /// ingress mode (the pacer on an IFB): both directions, as `cake`
    /// shapes them, so the default comparison is like with like.
    Shaper,
    /// `shaper run` on egress only.
    ShaperEgress,
    /// `shaper run` on egress and the AQM policer at ingress (`police`
    /// mode).
    ShaperPolice,
    /// As [`StateKind::Shaper`], named by its ingress mode (`ifb`).
    ShaperIfb,
    /// Upstream cake_mq on egress (a CAKE per TX queue, the rate shared
    /// among the active queues), CAKE on an IFB at ingress.
    CakeMq,
    /// `mq` with a CAKE per TX queue at rate / queues on egress, CAKE on an
    /// IFB at ingress.
    CakeSplit,
}

impl StateKind {
    /// The name used in `--states`, the JSON and the report.
    pub fn name(self) -> &'static str {
        match self {
            StateKind::None => "none",
            StateKind::Cake => "cake",
            StateKind::FqCodel => "fq_codel",
            StateKind::Shaper => "shaper",
            StateKind::ShaperEgress => "shaper-egress",
            StateKind::ShaperPolice => "shaper-police",
            StateKind::ShaperIfb => "shaper-ifb",
            StateKind::CakeMq => "cake_mq",
            StateKind::CakeSplit => "cake_split",
        }
    }

    /// The state shapes the download too (at the router's WAN ingress).
    pub fn shapes_download(self) -> bool {
        matches!(
            self,
            StateKind::Cake
                | StateKind::Shaper
                | StateKind::ShaperPolice
                | StateKind::ShaperIfb
                | StateKind::CakeMq
                | StateKind::CakeSplit
        )
    }

    /// The state needs a WAN device with more than one TX queue.
    pub fn needs_queues(self) -> bool {
        matches!(self, StateKind::CakeMq | StateKind::CakeSplit)
    }

    pub(crate) const ALL: [StateKind; 9] = [
        StateKind::None,
        StateKind::Cake,
        StateKind::FqCodel,
        StateKind::Shaper,
        StateKind::ShaperEgress,
        StateKind::ShaperPolice,
        StateKind::ShaperIfb,
        StateKind::CakeMq,
        StateKind::CakeSplit,
    ];
}

/// What every state shapes with beyond the rate.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Shaping {
    /// TX queues of the WAN device.
    pub queues: u32,
    /// The tins of the states that have them.
    pub diffserv: Diffserv,
    /// The link's framing.
    pub framing: FramingArgs,
    /// Host isolation, where the state has it; `None` isolates flows.
    pub isolation: Option<Isolation>,
    /// Isolation through the router's NAT.
    pub nat: bool,
}

impl StateKind {
    /// The state this kind names, shaping at `rate` (both directions where
    /// the kind shapes both), with the shaper binary `bin`, on one TX queue
    /// and without tins.
    pub fn state(self, bin: &std::path::Path, rate: Rate) -> super::State {
        self.shaping(
            bin,
            rate,
            &Shaping {
                queues: 1,
                ..Shaping::default()
            },
        )
    }

    /// As [`StateKind::state`], on a WAN device with `shaping.queues` TX
    /// queues, with the tins of `shaping.diffserv` where the kind has
    /// tins, and the link's framing and the host isolation where the kind
    /// takes them.
    pub fn shaping(self, bin: &std::path::Path, rate: Rate, shaping: &Shaping) -> super::State {
        let (queues, diffserv) = (shaping.queues, shaping.diffserv);
        let tins = diffserv.name();
        let mut cake_options = Vec::new();
        if diffserv != Diffserv::Besteffort {
            cake_options.push(tins.to_owned());
        }
        cake_options.extend(shaping.framing.cake_options());
        if let Some(mode) = shaping.isolation {
            cake_options.extend(super::hosts::cake_options(mode, shaping.nat));
        }
        let ingress = super::State::CakeIngress {
            rate,
            options: cake_options.clone(),
        };
        let with_ingress = |egress| super::State::Stack(vec![egress, ingress.clone()]);
        let mut shaper_args = Vec::new();
        if diffserv != Diffserv::Besteffort {
            shaper_args = vec!["--diffserv".to_owned(), tins.to_owned()];
        }
        shaper_args.extend(shaping.framing.shaper_args());
        if let Some(mode) = shaping.isolation {
            shaper_args.extend(super::hosts::shaper_args(mode, shaping.nat));
        }
        match self {
            StateKind::None => super::State::None,
            StateKind::Cake if cake_options.is_empty() => with_ingress(super::State::Cake { rate }),
            StateKind::Cake => with_ingress(super::State::CakeWith {
                rate,
                options: cake_options.clone(),
            }),
            StateKind::CakeMq => with_ingress(super::State::CakeMq { rate, tins }),
            StateKind::CakeSplit => with_ingress(super::State::CakeSplit { rate, queues, tins }),
            StateKind::FqCodel => super::State::FqCodel { rate },
            StateKind::ShaperEgress => super::State::Shaper {
                bin: bin.to_owned(),
                rate,
                extra_args: shaper_args,
            },
            StateKind::Shaper | StateKind::ShaperPolice | StateKind::ShaperIfb => {
                super::State::Shaper {
                    bin: bin.to_owned(),
                    rate,
                    extra_args: [
                        "--ingress-rate".to_owned(),
                        super::state::tc_rate(rate),
                        "--ingress-mode".to_owned(),
                        if self == StateKind::ShaperPolice {
                            "police".to_owned()
                        } else {
                            "ifb".to_owned()
                        },
                    ]
                    .into_iter()
                    .chain(shaper_args)
                    .collect(),
                }
            }
        }
    }
}

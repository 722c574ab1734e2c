use super::*;

const E: u64 = EPOCH_NS;

#[test]
fn codepoints_select_cakes_tins() {
    let d4 = Diffserv::Diffserv4;
    // Voice: EF, VA, CS4..CS7; video: AF2x..AF4x, CS2, CS3, TOS4; bulk: LE,
    // CS1; the rest best effort.
    for (dscp, tin) in [
        (46, 3),
        (44, 3),
        (32, 3),
        (40, 3),
        (48, 3),
        (56, 3),
        (34, 2),
        (26, 2),
        (18, 2),
        (16, 2),
        (24, 2),
        (4, 2),
        (1, 1),
        (8, 1),
        (0, 0),
        (10, 0),
        (2, 0),
        (63, 0),
    ] {
        assert_eq!(d4.tin_of(dscp), tin, "diffserv4, DSCP {dscp}");
    }
    let d3 = Diffserv::Diffserv3;
    for (dscp, tin) in [
        (46, 2),
        (44, 2),
        (4, 2),
        (48, 2),
        (40, 0),
        (34, 0),
        (8, 1),
        (1, 1),
    ] {
        assert_eq!(d3.tin_of(dscp), tin, "diffserv3, DSCP {dscp}");
    }
    let d8 = Diffserv::Diffserv8;
    for (dscp, tin) in [
        (1, 0),
        (8, 1),
        (12, 1),
        (2, 1),
        (0, 2),
        (3, 2),
        (24, 3),
        (36, 3),
        (4, 4),
        (20, 4),
        (16, 5),
        (46, 6),
        (32, 6),
        (48, 7),
        (56, 7),
    ] {
        assert_eq!(d8.tin_of(dscp), tin, "diffserv8, DSCP {dscp}");
    }
    for dscp in 0..64 {
        assert_eq!(Diffserv::Besteffort.tin_of(dscp), 0);
    }
}

#[test]
fn the_bit_planes_give_every_codepoints_tin_in_range() {
    for mode in Diffserv::ALL {
        let planes = mode.planes();
        for dscp in 0..64u8 {
            let t = tin_from_planes(&planes, dscp);
            assert_eq!(t, mode.tin_of(dscp), "{} DSCP {dscp}", mode.name());
            assert!(t < mode.tins());
        }
    }
}

#[test]
fn thresholds_are_cakes_fractions() {
    let d4 = Diffserv::Diffserv4;
    assert_eq!(
        [0, 1, 2, 3].map(|t| d4.threshold_q16(t)),
        [65536, 4096, 32768, 16384]
    );
    let d8: [u64; 8] = core::array::from_fn(|t| Diffserv::Diffserv8.threshold_q16(t));
    assert_eq!(d8[0], 65536);
    assert_eq!(d8[1], 57344);
    assert_eq!(d8[7], 25735);
    let st = TinState::new(d4);
    assert_eq!(st.tins, 4);
    assert_eq!(st.threshold_ns[3], E / 4);
    assert_eq!(st.ratio_q16[1], 16 << 16);
}

#[test]
fn a_tin_alone_reads_its_own_time() {
    for own in [0, 1, E / 3, E, 3 * E] {
        assert_eq!(tin_input(own, &TinView::SOLE), own);
    }
    assert_eq!(TinView::SOLE.scale_factors(), (1 << 16, 1 << 16));
    let st = TinState::default();
    assert_eq!(tin_view(&st, 0, 100), TinView::SOLE);
}

#[test]
fn a_voice_tin_beside_busy_best_effort_settles_at_its_threshold() {
    let mut st = TinState::new(Diffserv::Diffserv4);
    let epoch = 50;
    // Best effort, busy, takes the rest of the link; voice below a quarter.
    st.publish(0, epoch, E - E / 8, true);
    let voice = tin_view(&st, 3, epoch);
    assert_eq!(voice.higher_ns, 0);
    assert!(!voice.swing);
    // Below its threshold the input reads below one epoch: voice grows.
    assert!(tin_input(E / 8, &voice) < E);
    // At it, exactly one epoch.
    assert_eq!(tin_input(E / 4, &voice), E);
    // Above it, more than one whatever best effort leaves: voice yields.
    st.publish(0, epoch, E / 2, true);
    assert!(tin_input(E / 3, &tin_view(&st, 3, epoch)) > E);
    // Best effort counts voice up to its threshold, and takes the rest.
    st.publish(3, epoch, E / 2, true);
    let be = tin_view(&st, 0, epoch);
    assert!(be.swing);
    assert_eq!(be.higher_ns, E / 4);
    assert_eq!(tin_input(E / 2, &be), E);
    // Best effort idle for longer than BUSY_EPOCHS: voice takes the rest.
    st.publish(0, epoch, E / 8, false);
    let later = epoch + BUSY_EPOCHS + 1;
    st.publish(0, later, E / 8, false);
    let voice = tin_view(&st, 3, later);
    assert!(voice.swing);
    assert_eq!(tin_input(E - E / 8, &voice), E);
    // A bulk tin beside busy best effort holds its sixteenth.
    st.publish(0, later, E, true);
    let bulk = tin_view(&st, 1, later);
    assert!(!bulk.swing);
    assert_eq!(tin_input(E / 16, &bulk), E);
    // Its flows share a sixteenth: the cap scales by 16.
    assert_eq!(bulk.capacity_ns(), E / 16);
    assert_eq!(bulk.scale_factors().0, 16 << 16);
}

#[test]
fn a_tin_that_stops_publishing_fades() {
    assert_eq!(aged_usage(1000, 10, 11), 1000);
    assert_eq!(aged_usage(1000, 10, 12), 500);
    assert_eq!(aged_usage(1000, 10, 14), 250);
    assert_eq!(aged_usage(1000, 10, 500), 0);
    let mut st = TinState::new(Diffserv::Diffserv4);
    st.publish(3, 10, E / 4, false);
    assert_eq!(tin_view(&st, 0, 11).higher_ns, E / 4);
    assert_eq!(tin_view(&st, 0, 30).higher_ns, (E / 4) >> 10);
}

#[test]
fn cap_and_floor_scale_to_the_capacity_left() {
    let at = |others_ns| TinView {
        ratio_q16: ONE_Q16,
        higher_ns: 0,
        others_ns,
        swing: true,
        threshold_ns: E,
    };
    let one = 1 << 16;
    assert_eq!(at(0).scale_factors(), (one, one));
    // A quarter left: four times the flows' count.
    assert_eq!(at(E - E / 4).scale_factors(), (4 * one, 4 * one));
    // Between steps the cap rounds up and the floor down.
    let (cap, floor) = at(E / 20).scale_factors();
    let exact = (E as f64 / (E - E / 20) as f64) * one as f64;
    assert!(
        cap as f64 >= exact && floor as f64 <= exact,
        "{cap} {floor} {exact}"
    );
    assert!(cap - floor < one / 16);
    // Everything taken: the least capacity, 1/256, scales by 64 at most.
    assert_eq!(at(2 * E).capacity_ns(), E >> 8);
    assert_eq!(at(2 * E).scale_factors(), (64 * one, 64 * one));
    assert_eq!(scale_mult(3 << 16, 4 * one), 12 << 16);
    assert_eq!(scale_mult(MULT_MAX - 1, 2 * one), MULT_MAX - 1);
    assert_eq!(scale_mult(5 << 16, one), 5 << 16);
}

#[test]
fn tin_counters_sum_field_by_field() {
    let a = TinCounters {
        packets: 1,
        bytes: 2,
        drops: 3,
        marks: 4,
        delay_ns: 5,
    };
    let b = TinCounters {
        packets: u64::MAX,
        ..a
    };
    let s = a.add(&b);
    assert_eq!(
        (s.packets, s.bytes, s.drops, s.marks, s.delay_ns),
        (0, 4, 6, 8, 10)
    );
}

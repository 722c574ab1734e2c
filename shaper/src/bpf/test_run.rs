//! BPF_PROG_TEST_RUN (written by a helper).

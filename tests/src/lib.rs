//! Privileged integration tests.

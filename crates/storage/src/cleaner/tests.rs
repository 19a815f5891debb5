//! Tests of the log cleaner.

//! Bounded readers and writers for the protocol's primitive types.

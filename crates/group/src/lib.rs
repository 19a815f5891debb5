//! The group coordinator's state machine (classic protocol), pure and clock-injected.

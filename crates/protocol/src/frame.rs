//! Length-prefixed frames with a size cap.

//! The Rill server: listeners, connections, request dispatch and the replica manager.

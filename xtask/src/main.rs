//! Project tooling: `cargo xtask test`, `cargo xtask codegen`.

fn main() {}

//! `cargo xtask test`: the whole test run.

use std::path::Path;

pub fn run(_root: &Path, _args: &[String]) -> anyhow::Result<()> {
    anyhow::bail!("test runner not written yet")
}

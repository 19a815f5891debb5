//! `cargo xtask chaos`: the fault-injection suite (`tests/e2e/chaos.py`) run for as long as
//! asked, with the venv and the binary `cargo xtask test` uses. The short run is part of
//! `cargo xtask test` (`tests/e2e/test_chaos.py`); this is for the long ones:
//!
//! ```sh
//! cargo xtask chaos --minutes 30 --seed 42
//! cargo xtask chaos --scenario coordinator-partition --seed 7
//! cargo xtask chaos --minutes 3 --faults slow-disk,clock-jump,kill --seed 7
//! cargo xtask chaos --minutes 10 --transactional --seed 7  # transactions and their checks
//! cargo xtask chaos --minutes 5 -- --producers 5 --rate 200   # chaos.py's own options
//! ```

use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context};

use crate::test::{banner, cargo_program, ensure_venv, rill_binary};

const USAGE: &str = "usage: cargo xtask chaos [--minutes N | --seconds N] [--seed N] \
                     [--scenario random|ci|coordinator-partition] [--faults KIND,...] \
                     [--transactional] [-- <chaos.py options>]";

#[derive(Debug, PartialEq)]
struct Options {
    seconds: u64,
    seed: Option<u64>,
    scenario: String,
    faults: Option<String>,
    transactional: bool,
    extra: Vec<String>,
}

impl Options {
    fn parse(args: &[String]) -> anyhow::Result<Options> {
        let mut options = Options {
            seconds: 120,
            seed: None,
            scenario: "random".to_string(),
            faults: None,
            transactional: false,
            extra: Vec::new(),
        };
        let mut rest = args.iter();
        while let Some(arg) = rest.next() {
            let mut value = |name: &str| {
                rest.next()
                    .with_context(|| format!("{name} needs a value\n{USAGE}"))
                    .cloned()
            };
            match arg.as_str() {
                "--minutes" => options.seconds = value("--minutes")?.parse::<u64>()? * 60,
                "--seconds" => options.seconds = value("--seconds")?.parse()?,
                "--seed" => options.seed = Some(value("--seed")?.parse()?),
                "--scenario" => options.scenario = value("--scenario")?,
                "--faults" => options.faults = Some(value("--faults")?),
                "--transactional" => options.transactional = true,
                "--" => {
                    options.extra.extend(rest.by_ref().cloned());
                }
                other => bail!("unknown argument {other:?}\n{USAGE}"),
            }
        }
        Ok(options)
    }

    fn chaos_args(&self) -> Vec<String> {
        let mut args = vec![
            "tests/e2e/chaos.py".to_string(),
            "--scenario".to_string(),
            self.scenario.clone(),
            "--seconds".to_string(),
            self.seconds.to_string(),
        ];
        if let Some(seed) = self.seed {
            args.extend(["--seed".to_string(), seed.to_string()]);
        }
        if let Some(faults) = &self.faults {
            args.extend(["--faults".to_string(), faults.clone()]);
        }
        if self.transactional {
            args.push("--transactional".to_string());
        }
        args.extend(self.extra.iter().cloned());
        args
    }
}

pub fn run(root: &Path, args: &[String]) -> anyhow::Result<()> {
    let options = Options::parse(args)?;
    let rill_bin = rill_binary(root, &cargo_program())?;
    let python = ensure_venv(root)?;
    let chaos_args = options.chaos_args();
    banner(&format!("python {}", chaos_args.join(" ")));
    let status = Command::new(&python)
        .args(&chaos_args)
        .current_dir(root)
        .env("RILL_BIN", &rill_bin)
        .env("PYTHONUNBUFFERED", "1")
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .status()
        .context("could not start tests/e2e/chaos.py")?;
    if !status.success() {
        bail!("the chaos run failed ({status}); its seed and evidence are printed above");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(args: &[&str]) -> Vec<String> {
        args.iter().map(|arg| arg.to_string()).collect()
    }

    #[test]
    fn minutes_seed_and_passthrough_reach_chaos_py() {
        let options = Options::parse(&strings(&[
            "--minutes",
            "30",
            "--seed",
            "42",
            "--",
            "--rate",
            "5",
        ]))
        .unwrap();
        assert_eq!(
            options.chaos_args(),
            strings(&[
                "tests/e2e/chaos.py",
                "--scenario",
                "random",
                "--seconds",
                "1800",
                "--seed",
                "42",
                "--rate",
                "5"
            ])
        );
        let options = Options::parse(&strings(&["--faults", "slow-disk,clock-jump"])).unwrap();
        assert_eq!(
            options.chaos_args()[5..],
            strings(&["--faults", "slow-disk,clock-jump"])[..]
        );
        let options = Options::parse(&strings(&["--transactional", "--seed", "3"])).unwrap();
        assert_eq!(
            options.chaos_args()[5..],
            strings(&["--seed", "3", "--transactional"])[..]
        );
        assert!(Options::parse(&strings(&["--faults"])).is_err());
        assert!(Options::parse(&strings(&["--seed"])).is_err());
        assert!(Options::parse(&strings(&["--minutes", "x"])).is_err());
        assert!(Options::parse(&strings(&["--bogus"])).is_err());
    }
}

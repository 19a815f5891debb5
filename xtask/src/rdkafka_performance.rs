//! librdkafka's `rdkafka_performance`, built from source at test time: the independent
//! client of the end-to-end tests and benchmarks (issue #8 measures with it).
//!
//! No registry we can reach packages the tool, so it is compiled here in seconds:
//!
//! 1. The librdkafka sources come from the `rdkafka-sys` crate on crates.io (it vendors
//!    them): the `.crate` is downloaded with `curl` from static.crates.io into
//!    `target/rdkafka-performance/` and its sha256 checked against the pin below.
//! 2. Only `examples/rdkafka_performance.c` and the headers of `src/` are unpacked; a
//!    hand-written `config.h` stands in for librdkafka's `./configure` (the example needs
//!    just the thread and atomics choices from it).
//! 3. It is linked with `cc` against the librdkafka that the venv's confluent-kafka wheel
//!    bundles (`confluent_kafka.libs/`), with an rpath to it, so nothing of librdkafka is
//!    compiled but the one example. The wheel's library is newer than the crate's headers;
//!    librdkafka keeps its C ABI, and the example prints the library's version.
//! 4. A stamp (crate version and checksum, library version and path) beside the binary
//!    makes a second run reuse it; a new pin or a new wheel rebuilds.
//!
//! `cargo xtask rdkafka-performance` does this alone (making the venv if needed) and prints
//! the binary's path last, for benchmarks; `cargo xtask test` does it before pytest and
//! passes the path in `RDKAFKA_PERFORMANCE`.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};

use crate::test::{apt_install, apt_usable, banner, ensure_venv, find_on_path, on_ci};

/// The `rdkafka-sys` release whose vendored librdkafka is closest to the wheel's (2.16):
/// 4.10.0 vendors librdkafka 2.12.1, the newest on crates.io when this was pinned.
const CRATE_VERSION: &str = "4.10.0+2.12.1";
/// sha256 of that `.crate`, as crates.io's index records it (`cksum`).
const CRATE_SHA256: &str = "e234cf318915c1059d4921ef7f75616b5219b10b46e9f3a511a15eb4b56a3f77";
/// Where the download, the unpacked sources and the binary live, relative to the root:
/// beside the venv whose librdkafka the binary links (`test::VENV_DIR`), not under
/// `CARGO_TARGET_DIR`.
const BUILD_DIR: &str = "target/rdkafka-performance";
const BINARY: &str = "rdkafka_performance";
const STAMP: &str = "rill-stamp.txt";

/// What `./configure` would have found on any gcc or clang of the last decade: C11
/// threads, `__atomic` builtins. Without the atomics lines librdkafka 2.12's `rdatomic.h`
/// does not compile (its mutex fallback has a typo), and no histogram library.
const CONFIG_H: &str = "\
/* Written by `cargo xtask rdkafka-performance` in place of librdkafka's ./configure. */
#define WITH_C11THREADS 1
#define WITH_HDRHISTOGRAM 0
#define HAVE_ATOMICS_32 1
#define HAVE_ATOMICS_32_ATOMIC 1
#define ATOMIC_OP32(OP1, OP2, PTR, VAL) __atomic_##OP1##_##OP2(PTR, VAL, __ATOMIC_SEQ_CST)
#define HAVE_ATOMICS_64 1
#define HAVE_ATOMICS_64_ATOMIC 1
#define ATOMIC_OP64(OP1, OP2, PTR, VAL) __atomic_##OP1##_##OP2(PTR, VAL, __ATOMIC_SEQ_CST)
";

/// Asks the venv's interpreter for the wheel's librdkafka: its version, then the shared
/// libraries the wheel bundles.
const FIND_LIBRDKAFKA: &str = "\
import glob, os, confluent_kafka
libs = os.path.join(os.path.dirname(os.path.dirname(confluent_kafka.__file__)), 'confluent_kafka.libs')
print(confluent_kafka.libversion()[0])
for path in sorted(glob.glob(os.path.join(libs, 'librdkafka*.so*'))):
    print(path)
";

/// `cargo xtask rdkafka-performance`: builds (or reuses) the binary and prints its path.
pub fn run(root: &Path, args: &[String]) -> anyhow::Result<()> {
    if let Some(arg) = args.first() {
        if arg == "-h" || arg == "--help" {
            println!("usage: cargo xtask rdkafka-performance   (prints the binary's path last)");
            return Ok(());
        }
        bail!("unknown argument {arg:?}; usage: cargo xtask rdkafka-performance");
    }
    let python = ensure_venv(root)?;
    let binary = build(root, &python)?;
    println!("{}", binary.display());
    Ok(())
}

/// The step of `cargo xtask test`: the binary, or `None` (the tests that need it skip)
/// when it could not be built here; on CI (`CI` set) that is an error.
pub fn ensure(root: &Path, python: &Path) -> anyhow::Result<Option<PathBuf>> {
    match build(root, python) {
        Ok(binary) => Ok(Some(binary)),
        Err(error) if on_ci() => {
            Err(error.context("rdkafka_performance could not be built (its tests must run on CI)"))
        }
        Err(error) => {
            println!("    WARNING: rdkafka_performance could not be built: {error:#}");
            println!("    the rdkafka_performance tests will be SKIPPED");
            Ok(None)
        }
    }
}

/// Builds the binary unless the stamp says the one present is current; returns its path.
fn build(root: &Path, python: &Path) -> anyhow::Result<PathBuf> {
    banner(&format!(
        "rdkafka_performance (rdkafka-sys {CRATE_VERSION})"
    ));
    let dir = root.join(BUILD_DIR);
    let binary = dir.join(BINARY);
    let library = Librdkafka::find(python)?;
    let stamp_path = dir.join(STAMP);
    let stamp = library.stamp();
    let current = std::fs::read_to_string(&stamp_path).is_ok_and(|old| old == stamp);
    if current && binary.is_file() {
        println!("    reusing {} (same pins)", binary.display());
        return Ok(binary);
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let _ = std::fs::remove_file(&stamp_path);

    let crate_file = download_crate(&dir)?;
    let sources = dir.join("librdkafka");
    unpack(&crate_file, &sources)?;
    compile(&sources, &library, &binary)?;
    check_runs(&binary, &library)?;
    std::fs::write(&stamp_path, stamp)
        .with_context(|| format!("writing {}", stamp_path.display()))?;
    println!("    built {}", binary.display());
    Ok(binary)
}

/// The librdkafka shared library inside the venv's confluent-kafka wheel.
struct Librdkafka {
    version: String,
    path: PathBuf,
}

impl Librdkafka {
    fn find(python: &Path) -> anyhow::Result<Librdkafka> {
        let output = Command::new(python)
            .args(["-c", FIND_LIBRDKAFKA])
            .output()
            .with_context(|| format!("could not run {}", python.display()))?;
        if !output.status.success() {
            bail!(
                "{} could not import confluent_kafka: {}",
                python.display(),
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
        let stdout = String::from_utf8_lossy(&output.stdout);
        let mut lines = stdout.lines();
        let version = lines.next().unwrap_or_default().trim().to_string();
        let Some(path) = lines.next() else {
            bail!(
                "the confluent-kafka in {} bundles no librdkafka (confluent_kafka.libs/ is \
                 missing: installed from source rather than a wheel?)",
                python.display()
            );
        };
        Ok(Librdkafka {
            version,
            path: PathBuf::from(path.trim()),
        })
    }

    fn stamp(&self) -> String {
        format!(
            "rdkafka-sys {CRATE_VERSION} sha256 {CRATE_SHA256}\nlibrdkafka {} at {}\n",
            self.version,
            self.path.display()
        )
    }
}

fn crate_url() -> String {
    format!("https://static.crates.io/crates/rdkafka-sys/rdkafka-sys-{CRATE_VERSION}.crate")
}

/// Downloads the pinned `.crate` (kept once verified) and returns its path.
fn download_crate(dir: &Path) -> anyhow::Result<PathBuf> {
    let file = dir.join(format!("rdkafka-sys-{CRATE_VERSION}.crate"));
    if file.is_file() && sha256(&file)? == CRATE_SHA256 {
        println!("    reusing {}", file.display());
        return Ok(file);
    }
    let curl = curl()?;
    let url = crate_url();
    println!("    downloading {url}");
    let partial = dir.join(format!("rdkafka-sys-{CRATE_VERSION}.crate.part"));
    let status = Command::new(curl)
        .args(["-fsSL", "--retry", "3", "--connect-timeout", "30", "-o"])
        .arg(&partial)
        .arg(&url)
        .status()
        .context("could not start curl")?;
    if !status.success() {
        let _ = std::fs::remove_file(&partial);
        bail!("curl could not download {url} ({status})");
    }
    let actual = sha256(&partial)?;
    if actual != CRATE_SHA256 {
        let _ = std::fs::remove_file(&partial);
        bail!("{url} has sha256 {actual}, expected the pinned {CRATE_SHA256}");
    }
    std::fs::rename(&partial, &file).with_context(|| format!("renaming to {}", file.display()))?;
    Ok(file)
}

/// `curl` from `PATH`, installed from Debian's packages when missing and apt is usable.
fn curl() -> anyhow::Result<PathBuf> {
    if let Some(curl) = find_on_path("curl") {
        return Ok(curl);
    }
    if apt_usable() {
        println!("    curl not on PATH; installing it with apt-get");
        if apt_install("curl") {
            if let Some(curl) = find_on_path("curl") {
                return Ok(curl);
            }
        }
    }
    bail!("curl is not installed (it downloads the librdkafka sources; `apt-get install curl`)")
}

/// The file's sha256 in lowercase hex, by coreutils' `sha256sum`.
fn sha256(file: &Path) -> anyhow::Result<String> {
    let output = Command::new("sha256sum")
        .arg(file)
        .output()
        .context("could not run sha256sum (coreutils)")?;
    if !output.status.success() {
        bail!("sha256sum {} failed", file.display());
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    match stdout.split_whitespace().next() {
        Some(hex) => Ok(hex.to_ascii_lowercase()),
        None => bail!("sha256sum printed nothing for {}", file.display()),
    }
}

/// Unpacks `src/` and the example into `sources` (afresh) and writes `config.h` beside
/// them, where `src/rd.h` looks for it (`../config.h`).
fn unpack(crate_file: &Path, sources: &Path) -> anyhow::Result<()> {
    if sources.exists() {
        std::fs::remove_dir_all(sources)
            .with_context(|| format!("removing {}", sources.display()))?;
    }
    std::fs::create_dir_all(sources).with_context(|| format!("creating {}", sources.display()))?;
    let prefix = format!("rdkafka-sys-{CRATE_VERSION}/librdkafka");
    let status = Command::new("tar")
        .arg("-xzf")
        .arg(crate_file)
        .arg("-C")
        .arg(sources)
        .arg("--strip-components=2")
        .arg(format!("{prefix}/src"))
        .arg(format!("{prefix}/examples/{BINARY}.c"))
        .arg(format!("{prefix}/LICENSE"))
        .status()
        .context("could not start tar")?;
    if !status.success() {
        bail!("tar could not unpack {} ({status})", crate_file.display());
    }
    std::fs::write(sources.join("config.h"), CONFIG_H).context("writing config.h")?;
    Ok(())
}

/// Compiles the example against the wheel's library into `binary` (via a temporary name,
/// so that a failed build leaves no binary behind).
fn compile(sources: &Path, library: &Librdkafka, binary: &Path) -> anyhow::Result<()> {
    let cc = std::env::var_os("CC")
        .filter(|cc| !cc.is_empty())
        .unwrap_or_else(|| "cc".into());
    let Some(library_dir) = library.path.parent() else {
        bail!("{} has no parent directory", library.path.display());
    };
    let partial = binary.with_extension("part");
    let mut command = Command::new(&cc);
    command
        .arg("-O2")
        .arg("-w")
        .arg("-I")
        .arg(sources.join("src"))
        .arg("-o")
        .arg(&partial)
        .arg(sources.join("examples").join(format!("{BINARY}.c")))
        .arg(&library.path)
        .arg(format!("-Wl,-rpath,{}", library_dir.display()))
        .args(["-lpthread", "-lm"]);
    println!(
        "    {} -O2 ... {BINARY}.c {}",
        cc.to_string_lossy(),
        library.path.display()
    );
    let output = command.output().with_context(|| {
        format!(
            "could not run the C compiler {:?} (set CC, or install gcc)",
            cc.to_string_lossy()
        )
    })?;
    if !output.status.success() {
        bail!(
            "compiling {BINARY}.c failed ({}):\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    std::fs::rename(&partial, binary).with_context(|| format!("renaming to {}", binary.display()))
}

/// Runs the binary without arguments: it prints its usage with the library's version and
/// exits 1. A missing library (a broken rpath) shows here rather than in every test.
fn check_runs(binary: &Path, library: &Librdkafka) -> anyhow::Result<()> {
    let output = Command::new(binary)
        .output()
        .with_context(|| format!("could not run {}", binary.display()))?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    let expected = format!("librdkafka version {}", library.version);
    if !stderr.contains(&expected) {
        bail!(
            "{} does not run as expected (no {expected:?} in its usage):\n{stderr}",
            binary.display()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pins_are_well_formed() {
        assert_eq!(CRATE_SHA256.len(), 64);
        assert!(CRATE_SHA256
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
        assert!(crate_url().ends_with("/rdkafka-sys-4.10.0+2.12.1.crate"));
    }

    #[test]
    fn the_stamp_changes_with_the_library() {
        let library = |version: &str, path: &str| Librdkafka {
            version: version.to_string(),
            path: PathBuf::from(path),
        };
        let old = library("2.16.0", "/v/confluent_kafka.libs/librdkafka-0cb94173.so.1");
        let new = library("2.17.0", "/v/confluent_kafka.libs/librdkafka-1d2e3f40.so.1");
        assert_ne!(old.stamp(), new.stamp());
        assert!(old.stamp().contains(CRATE_SHA256));
    }
}

//! The release checks of `ci` (docs/RELEASES.md says the policy they enforce):
//!
//! - **semver**: every published crate ([`crate::ci::PUBLISHED`]) against the last release,
//!   with `cargo-semver-checks` (`check-release --baseline-rev vX.Y.Z`): a change that
//!   breaks the public API without the version bump the policy asks for fails CI. A release
//!   is a git tag `vX.Y.Z` on the commit published; with no such tag there is no baseline
//!   and the step is recorded as skipped with that reason (never passed). A crate that did
//!   not exist at the tag has no baseline either, and is skipped by name.
//! - **msrv**: the workspace's `rust-version` is a toolchain CI builds. When the toolchain
//!   every other step uses is that version, those steps are the MSRV build (recorded as a
//!   skip saying so); otherwise the whole workspace is checked with `cargo +<rust-version>`
//!   (installed when missing). A toolchain older than the declared one fails: the field
//!   would promise what nobody builds.

use std::fs;
use std::process::Command;

use anyhow::{Context as _, Result, bail};

use crate::venv::{Venv, with_libtorch};
use crate::{Steps, root, run_status};

/// A release tag's version: `v0.2.1` -> (0, 2, 1). Anything else (a pre-release, another
/// name) is not a release tag.
fn release_version(tag: &str) -> Option<(u64, u64, u64)> {
    let mut parts = tag.strip_prefix('v')?.split('.');
    let mut next = || -> Option<u64> {
        let p = parts.next()?;
        if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        p.parse().ok()
    };
    let version = (next()?, next()?, next()?);
    parts.next().is_none().then_some(version)
}

/// The newest release tag among `tags`, if any.
fn last_release<'a>(tags: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    tags.into_iter()
        .filter_map(|t| release_version(t).map(|v| (v, t)))
        .max()
        .map(|(_, t)| t)
}

/// Why the semver step has nothing to compare with before the first release.
const NO_RELEASE: &str = "no release yet: no `vX.Y.Z` git tag to compare with (0.1.0 was never \
                          published); tag the commit a release publishes";

/// What the semver step does for one published crate.
#[derive(Debug, PartialEq, Eq)]
enum Semver {
    /// `cargo semver-checks check-release -p <crate> --baseline-rev <tag>`.
    Check { tag: String },
    /// Nothing to compare with, and why.
    Skip(String),
}

/// The plan for `crate_name`, given the last release tag (if any) and whether the crate's
/// manifest exists at that tag.
fn semver_plan(crate_name: &str, tag: Option<&str>, existed_at_tag: bool) -> Semver {
    match tag {
        None => Semver::Skip(NO_RELEASE.to_owned()),
        Some(tag) if !existed_at_tag => Semver::Skip(format!(
            "{crate_name} is new since {tag}: no released API to compare with"
        )),
        Some(tag) => Semver::Check {
            tag: tag.to_owned(),
        },
    }
}

/// The git tags of the repository.
fn git_tags() -> Result<Vec<String>> {
    let out = Command::new("git")
        .args(["tag", "--list", "v*"])
        .current_dir(root())
        .output()
        .context("could not run `git tag`: the semver step needs the repository's tags")?;
    if !out.status.success() {
        bail!("`git tag --list` exited with {}", out.status);
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.trim().to_owned())
        .filter(|l| !l.is_empty())
        .collect())
}

/// Whether `path` exists in the tree of `rev`.
fn exists_at(rev: &str, path: &str) -> Result<bool> {
    let status = Command::new("git")
        .args(["cat-file", "-e", &format!("{rev}:{path}")])
        .current_dir(root())
        .stderr(std::process::Stdio::null())
        .status()
        .context("could not run `git cat-file`")?;
    Ok(status.success())
}

/// The semver step: each published crate against the last release tag.
pub(crate) fn semver(steps: &mut Steps, venv: &Venv) -> Result<()> {
    let tags = git_tags()?;
    let tag = last_release(tags.iter().map(String::as_str));
    let mut plans = Vec::new();
    for name in crate::ci::PUBLISHED {
        let existed = match tag {
            Some(tag) => exists_at(tag, &format!("crates/{name}/Cargo.toml"))?,
            None => false,
        };
        plans.push((*name, semver_plan(name, tag, existed)));
    }
    if tag.is_none() {
        // One line for all: no release, so no crate has a baseline.
        steps.skip("semver-checks", NO_RELEASE);
        return Ok(());
    }
    install_semver_checks(steps)?;
    let libtorch = venv.torch_dir()?;
    for (name, plan) in plans {
        let step = format!("semver-checks {name}");
        match plan {
            Semver::Skip(why) => steps.skip(&step, &why),
            Semver::Check { tag } => steps.cmd(
                &step,
                with_libtorch(venv.cargo(), &libtorch).args([
                    "semver-checks",
                    "check-release",
                    "--package",
                    name,
                    "--baseline-rev",
                    &tag,
                ]),
            )?,
        }
    }
    Ok(())
}

/// cargo-semver-checks from crates.io, installed when missing; a refusal fails the step.
fn install_semver_checks(steps: &mut Steps) -> Result<()> {
    let have = Command::new("cargo")
        .args(["semver-checks", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if have {
        println!("==> cargo-semver-checks present");
        return Ok(());
    }
    steps.run("install cargo-semver-checks", || {
        run_status(crate::cargo().args(["install", "cargo-semver-checks", "--locked"]))
    })
}

/// The workspace's `rust-version`, from the root manifest's `[workspace.package]`.
fn declared_rust_version(manifest: &str) -> Option<String> {
    let package = manifest.split("[workspace.package]").nth(1)?;
    let table = package.split("\n[").next()?;
    table.lines().find_map(|l| {
        let value = l.trim().strip_prefix("rust-version")?.trim_start();
        let value = value.strip_prefix('=')?.trim();
        Some(value.trim_matches('"').to_owned())
    })
}

/// `1.95` / `1.95.0` -> (1, 95, 0).
fn version_triple(v: &str) -> Option<(u64, u64, u64)> {
    let mut parts = v.trim().split('.').map(|p| p.parse::<u64>().ok());
    let major = parts.next()??;
    let minor = parts.next()??;
    let patch = parts.next().unwrap_or(Some(0))?;
    parts.next().is_none().then_some((major, minor, patch))
}

/// The version `rustc --version` prints: `rustc 1.95.0 (59807616e 2026-04-14)` -> 1.95.0.
fn rustc_version(output: &str) -> Option<(u64, u64, u64)> {
    let v = output.split_whitespace().nth(1)?;
    // A nightly or beta says `1.97.0-nightly`: the release it leads to.
    version_triple(v.split('-').next()?)
}

/// What the MSRV step does.
#[derive(Debug, PartialEq, Eq)]
enum Msrv {
    /// The toolchain of the other steps is the declared one: they are the MSRV build.
    Covered,
    /// Check the workspace with this rustup toolchain (`1.95` -> `1.95.0`).
    Check(String),
    /// The toolchain is older than the field says: nothing builds the declared version.
    Older { declared: String, found: String },
}

fn msrv_plan(declared: &str, found: (u64, u64, u64)) -> Result<Msrv> {
    let want = version_triple(declared)
        .with_context(|| format!("`rust-version = \"{declared}\"` is not a version"))?;
    let show = |(a, b, c): (u64, u64, u64)| format!("{a}.{b}.{c}");
    Ok(if found == want {
        Msrv::Covered
    } else if found < want {
        Msrv::Older {
            declared: show(want),
            found: show(found),
        }
    } else {
        Msrv::Check(show(want))
    })
}

/// The MSRV step: the declared `rust-version` is a toolchain this CI builds with.
pub(crate) fn msrv(steps: &mut Steps, venv: &Venv) -> Result<()> {
    let manifest = fs::read_to_string(root().join("Cargo.toml")).context("the root manifest")?;
    let declared = declared_rust_version(&manifest)
        .context("the root manifest's [workspace.package] has no `rust-version`")?;
    let out = Command::new("rustc")
        .arg("--version")
        .current_dir(root())
        .output()
        .context("could not run `rustc --version`")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let found = rustc_version(&text)
        .with_context(|| format!("`rustc --version` printed {:?}", text.trim()))?;
    match msrv_plan(&declared, found)? {
        Msrv::Covered => steps.skip(
            &format!("msrv {declared}"),
            "every other step builds with this toolchain: they are the MSRV build",
        ),
        Msrv::Older { declared, found } => bail!(
            "rust-version is {declared} but CI's rustc is {found}: CI would not build the \
             declared MSRV (install {declared} or lower the field to what CI builds)"
        ),
        Msrv::Check(toolchain) => {
            steps.run(&format!("msrv: toolchain {toolchain}"), || {
                run_status(Command::new("rustup").args([
                    "toolchain",
                    "install",
                    &toolchain,
                    "--profile",
                    "minimal",
                ]))
            })?;
            let libtorch = venv.torch_dir()?;
            steps.cmd(
                &format!("msrv {toolchain}: cargo check --workspace --all-targets"),
                with_libtorch(venv.cargo(), &libtorch).args([
                    &format!("+{toolchain}"),
                    "check",
                    "--workspace",
                    "--all-targets",
                ]),
            )?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn release_tags_are_vx_y_z_only() {
        assert_eq!(release_version("v0.1.0"), Some((0, 1, 0)));
        assert_eq!(release_version("v1.22.333"), Some((1, 22, 333)));
        for not in [
            "0.1.0",
            "v0.1",
            "v0.1.0-rc.1",
            "v0.1.0.1",
            "v0..1",
            "va.b.c",
            "last",
        ] {
            assert_eq!(release_version(not), None, "{not}");
        }
        // Numeric order, not text order: v0.10.0 is newer than v0.9.3.
        assert_eq!(
            last_release(["v0.9.3", "v0.10.0", "v0.2.0", "nightly"]),
            Some("v0.10.0")
        );
        assert_eq!(last_release(["v0.1.0-rc.1", "other"]), None);
        assert_eq!(last_release(Vec::<&str>::new()), None);
    }

    #[test]
    fn semver_checks_need_a_release_and_the_crate_in_it() {
        let Semver::Skip(why) = semver_plan("tensorbridge", None, false) else {
            panic!("no tag: nothing to compare with");
        };
        assert!(why.contains("no release yet"), "{why}");
        let Semver::Skip(why) = semver_plan("tensorbridge-burn", Some("v0.2.0"), false) else {
            panic!("a crate new since the tag has no baseline");
        };
        assert!(
            why.contains("tensorbridge-burn is new since v0.2.0"),
            "{why}"
        );
        assert_eq!(
            semver_plan("tensorbridge", Some("v0.2.0"), true),
            Semver::Check {
                tag: "v0.2.0".to_owned()
            }
        );
    }

    #[test]
    fn rust_version_is_read_from_the_workspace_table() {
        let manifest = "[workspace]\nmembers = []\n\n[workspace.package]\nversion = \"0.1.0\"\n\
                        rust-version = \"1.95\"\nlicense = \"MIT\"\n\n[other]\nrust-version = \"9\"\n";
        assert_eq!(declared_rust_version(manifest).as_deref(), Some("1.95"));
        assert_eq!(
            declared_rust_version("[workspace.package]\nversion = \"1\"\n"),
            None
        );
    }

    #[test]
    fn msrv_decision() {
        assert_eq!(
            rustc_version("rustc 1.95.0 (59807616e 2026-04-14)"),
            Some((1, 95, 0))
        );
        assert_eq!(
            rustc_version("rustc 1.97.0-nightly (abc 2026-05-01)"),
            Some((1, 97, 0))
        );
        assert_eq!(msrv_plan("1.95", (1, 95, 0)).unwrap(), Msrv::Covered);
        assert_eq!(
            msrv_plan("1.95", (1, 96, 1)).unwrap(),
            Msrv::Check("1.95.0".to_owned())
        );
        assert_eq!(
            msrv_plan("1.88", (1, 87, 0)).unwrap(),
            Msrv::Older {
                declared: "1.88.0".to_owned(),
                found: "1.87.0".to_owned()
            }
        );
        assert!(msrv_plan("one", (1, 95, 0)).is_err());
    }

    #[test]
    fn this_toolchain_builds_the_declared_msrv() {
        // CI has one stable toolchain; the field says what it builds (docs/RELEASES.md, "MSRV").
        let manifest = fs::read_to_string(root().join("Cargo.toml")).expect("the root manifest");
        let declared = declared_rust_version(&manifest).expect("a rust-version");
        let out = Command::new("rustc")
            .arg("--version")
            .output()
            .expect("rustc");
        let found = rustc_version(&String::from_utf8_lossy(&out.stdout)).expect("a version");
        assert!(
            !matches!(msrv_plan(&declared, found).unwrap(), Msrv::Older { .. }),
            "rust-version {declared} is newer than this rustc ({found:?}): nothing here builds it"
        );
    }

    #[test]
    fn every_published_crate_says_how_docs_rs_builds_it() {
        for name in crate::ci::PUBLISHED {
            let path = root().join("crates").join(name).join("Cargo.toml");
            let toml = fs::read_to_string(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
            let table = toml
                .split("[package.metadata.docs.rs]")
                .nth(1)
                .and_then(|rest| rest.split("\n[").next())
                .unwrap_or_else(|| panic!("{name}: no [package.metadata.docs.rs]"))
                .lines()
                .filter(|l| !l.trim_start().starts_with('#'))
                .collect::<Vec<_>>()
                .join("\n");
            assert!(
                table.contains(r#"rustdoc-args = ["--cfg", "docsrs"]"#),
                "{name}: docs.rs must pass --cfg docsrs (the crates' cfg_attr(docsrs, ...))"
            );
            // docs.rs has no libtorch and no CUDA toolkit: every feature would ask for both.
            assert!(
                !table.contains("all-features"),
                "{name}: all-features on docs.rs"
            );
            let features = table
                .lines()
                .find_map(|l| l.trim().strip_prefix("features = "))
                .unwrap_or("[]");
            let needs_libtorch_or_nvcc = match *name {
                // The facade's `tch`: libtorch at build time.
                "tensorbridge" => features.contains("\"tch\""),
                // candle's `cuda`: nvcc builds candle's kernels.
                "tensorbridge-candle" => features.contains("\"cuda\""),
                // tch's own docs.rs mode (build.rs then compiles no shim).
                "tensorbridge-tch" => !features.contains("\"tch/doc-only\""),
                _ => false,
            };
            assert!(
                !needs_libtorch_or_nvcc,
                "{name}: docs.rs features {features} need libtorch or nvcc"
            );
        }
    }
}

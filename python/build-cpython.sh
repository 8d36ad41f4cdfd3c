#!/usr/bin/env bash
# Builds CPython VERSION (3.13) from Debian's source package into PREFIX, for a machine that
# has no such interpreter (`cargo xtask` runs this when it finds none; docs/BUILDING.md,
# "Python environments"). Usage: build-cpython.sh VERSION PREFIX
#
# Debian 12, the build machine, carries CPython 3.11 only; Debian 13 (trixie) carries 3.13.
# Its binary packages need trixie's glibc, so this takes trixie's *source* package through a
# private apt configuration (the system's sources and package lists are left alone; apt checks
# the download against the signed archive), installs the build dependencies from the system's
# own suite, and builds with the upstream build system: a shared libpython (the pyo3 crate's
# tests embed it) found through an rpath, pip included. About two minutes on two idle cores.
# The interpreter is built in PREFIX.tmp and renamed to PREFIX only once it works, so an
# interrupted build leaves nothing that looks finished.
set -euo pipefail
version="${1:?usage: build-cpython.sh VERSION PREFIX}"
prefix="${2:?usage: build-cpython.sh VERSION PREFIX}"
suite="${TB_CPYTHON_SUITE:-trixie}"
mirror="${TB_DEBIAN_MIRROR:-http://deb.debian.org/debian}"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/apt/lists/partial" "$work/apt/cache/archives/partial" "$work/src"
echo "deb-src $mirror $suite main" >"$work/apt/sources.list"
apt_private=(
    -o "Dir::Etc::SourceList=$work/apt/sources.list"
    -o "Dir::Etc::SourceParts=/dev/null"
    -o "Dir::State::Lists=$work/apt/lists"
    -o "Dir::Cache=$work/apt/cache"
)

echo "==> build-cpython: Debian $suite's python$version source package"
apt-get "${apt_private[@]}" update -q
(cd "$work/src" && apt-get "${apt_private[@]}" source --download-only -q "python$version")
orig="$(ls "$work/src/python${version}_"*.orig.tar.* | head -n 1)"
echo "==> build-cpython: $(basename "$orig")"

echo "==> build-cpython: build dependencies (the system's own suite)"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends build-essential pkg-config libssl-dev zlib1g-dev \
    libffi-dev libbz2-dev liblzma-dev libsqlite3-dev libreadline-dev uuid-dev libgdbm-dev \
    libncurses-dev xz-utils

mkdir -p "$work/build"
tar -xf "$orig" -C "$work/build" --strip-components=1
rm -rf "$prefix.tmp"
cd "$work/build"
# The rpath is the final prefix's: the interpreter is moved there before it is used.
./configure -q --prefix="$prefix" --enable-shared --with-ensurepip=install \
    LDFLAGS="-Wl,-rpath,$prefix/lib"
make -s -j"$(nproc)"
make -s install DESTDIR="$prefix.tmp"
# DESTDIR installs under $prefix.tmp/$prefix: move that tree into place.
rm -rf "$prefix"
mkdir -p "$(dirname "$prefix")"
mv "$prefix.tmp$prefix" "$prefix"
rm -rf "$prefix.tmp"
"$prefix/bin/python$version" -c "import ssl, ctypes, sqlite3, lzma, bz2, zlib, venv, sys; print('built', sys.version)"

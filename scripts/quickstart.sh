#!/usr/bin/env bash
# The README's quick start as a user builds it: examples/quickstart copied to a directory
# outside this workspace, its projectionist dependency pointed at this checkout, then
# checked for format, built and tested (its test needs DATABASE_URL). Builds in this
# checkout's target directory, so that the dependencies compiled for the workspace are reused.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cp -r "$repo/examples/quickstart/." "$dir/"
sed -i "s|path = \"../..\"|path = \"$repo\"|" "$dir/Cargo.toml"
grep -q "path = \"$repo\"" "$dir/Cargo.toml"
# The workspace's lock file: the same dependency versions as the tested workspace.
cp "$repo/Cargo.lock" "$dir/Cargo.lock"
cd "$dir"
echo "Quick start: building and testing examples/quickstart in $dir"
cargo fmt --check
CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$repo/target}" cargo test

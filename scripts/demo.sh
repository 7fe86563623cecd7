#!/usr/bin/env bash
# The main job until `qcowtool bench` exists: create a base image and an
# overlay, write through the chain, and show info, map and check.
set -euo pipefail
cd "$(dirname "$0")/.."
q=./build/qcowtool
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
$q create -q -o cluster_size=64k "$dir/base.qcow2" 64M
$q io "$dir/base.qcow2" -c 'write -P 0x11 0 16M' >/dev/null
$q snapshot -o cluster_size=64k,extended_l2=on "$dir/base.qcow2" "$dir/top.qcow2"
$q io "$dir/top.qcow2" -c 'write -P 0x22 4k 4k' -c 'write -z 1M 64k' >/dev/null
$q info --backing-chain "$dir/top.qcow2"
echo
$q map "$dir/top.qcow2"
echo
$q check "$dir/top.qcow2"

#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The main job: `qcowtool bench` (the overlay workload: a base image, a stack
# of overlays, random reads and writes at each depth with write
# amplification) on scratch images in a temporary directory, printing its
# table. Extra arguments go to `qcowtool bench`.
set -euo pipefail
cd "$(dirname "$0")/.."
exec ./build/qcowtool bench "$@"

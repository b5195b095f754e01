#!/bin/sh
# The main job on the embedded default (README, first command).
set -eu
./megamoe --version

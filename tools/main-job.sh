#!/bin/sh
# The main job on the embedded default (README, first command):
#  1. generation with the embedded tiny DeepSeek-V4 model (fixtures/tiny-dsv4), when present;
#  2. one fused MoE layer on a synthetic tiny layer, through the CPU oracle.
set -eu
cd "$(dirname "$0")/.."
bin=./megamoe
$bin --version
if test -f fixtures/tiny-dsv4/config.json; then
  echo "== megamoe generate --model fixtures/tiny-dsv4 (the embedded default model)"
  prompt=$(cat fixtures/tiny-dsv4/main-prompt.txt 2>/dev/null || echo "1 2 3 4 5")
  $bin generate --model fixtures/tiny-dsv4 --prompt "$prompt" --max-tokens 32
  $bin generate --model fixtures/tiny-dsv4 --prompt "a b c d e f" --max-tokens 12
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/megamoe-main.XXXXXX")
trap 'rm -rf "$work"' EXIT
echo "== megamoe moe on a synthetic tiny layer (CPU oracle, recipe sm100)"
$bin synth-layer --shape tiny --input-tokens 16 --seed 1 --out "$work/layer.safetensors"
$bin moe --weights "$work/layer.safetensors" --input "$work/layer.input.safetensors" --out "$work/y.safetensors"
$bin inspect "$work/y.safetensors" --stats

#!/usr/bin/env bash
# Installs the build into a scratch prefix, then configures, builds and runs
# the consumer programs against it with find_package(anchorkv).
#   run.sh BUILD_DIR [MODEL.gguf]
set -euo pipefail
build="$1"
model="${2:-}"
here="$(cd "$(dirname "$0")" && pwd)"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
cmake --install "$build" --prefix "$scratch/prefix" >/dev/null
cmake -S "$here" -B "$scratch/build" -DCMAKE_PREFIX_PATH="$scratch/prefix" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$scratch/build" -j2 >/dev/null
"$scratch/build/cache_consumer"
if [ -n "$model" ] && [ -f "$model" ]; then "$scratch/build/runtime_consumer" "$model"; fi
echo "consumer ok"

#!/usr/bin/env bash
# Installs the Debian packages anchorkv needs to build and test, if missing.
# Sourced by scripts/demo and scripts/test; safe to run repeatedly.
set -euo pipefail

ANCHORKV_PACKAGES=(
  g++ cmake make pkg-config
  libhwy-dev          # Google Highway: SIMD with runtime dispatch
  libicu-dev          # ICU: Unicode classes and regex (BPE pre-tokenizers)
  libgtest-dev        # GoogleTest
  libbenchmark-dev    # Google Benchmark
  libcli11-dev        # command-line parsing
  nlohmann-json3-dev  # JSON output
  libfmt-dev          # formatting
  libxxhash-dev       # xxHash64 checksums of cache files (header-only use)
  redis-server        # the tests start one (no persistence, loopback only)
  python3 python3-dev python3-numpy python3-pytest python3-pip
  python3-requests    # the server tests' HTTP client
  pybind11-dev        # Python bindings
)

# The Debian interpreter, where python3-numpy and python3-pytest live.
ANCHORKV_PYTHON="${ANCHORKV_PYTHON:-/usr/bin/python3}"

anchorkv_install_deps() {
  local missing=()
  for p in "${ANCHORKV_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  # Node.js drives the server with the official OpenAI client in the tests;
  # any Node.js 18+ serves (Debian's, or one installed another way).
  command -v node >/dev/null 2>&1 || missing+=(nodejs)
  command -v npm >/dev/null 2>&1 || missing+=(npm)
  if [ ${#missing[@]} -eq 0 ]; then return 0; fi
  echo "anchorkv: installing missing packages: ${missing[*]}"
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

# The official OpenAI client for Node.js, pinned, into build/npm (the tests
# find it through ANCHORKV_NODE_MODULES). Installed once.
ANCHORKV_OPENAI_NPM="openai@6.30.1"
anchorkv_install_npm_client() {
  local prefix="build/npm"
  if [ -f "$prefix/node_modules/openai/package.json" ] &&
     grep -q "\"version\": \"${ANCHORKV_OPENAI_NPM#openai@}\"" "$prefix/node_modules/openai/package.json"; then
    return 0
  fi
  echo "anchorkv: installing $ANCHORKV_OPENAI_NPM (npm) for the server tests"
  mkdir -p "$prefix"
  npm install --silent --no-audit --no-fund --no-save --prefix "$prefix" "$ANCHORKV_OPENAI_NPM"
}

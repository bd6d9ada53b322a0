#!/usr/bin/env bash
# Installs what libwsync needs to build and test on Debian 12, from Debian's own packages.
#   scripts/install-deps.sh          everything (build, tests, sanitizers, fuzzers, bindings)
#   scripts/install-deps.sh --build  only what building the library and the wsync tool needs
set -euo pipefail
build=(build-essential cmake pkg-config nlohmann-json3-dev libxxhash-dev libucx-dev)
tests=(libcmocka-dev clang-14 libclang-rt-14-dev python3 python3-pytest python3-numpy
       python3-torch python3-xxhash python3-venv binutils dpkg-dev lintian libucx0 ucx-utils iproute2 nftables
       libssl3 libssl-dev)  # the ucx kind opens libcrypto.so.3; test_ucx_trust links it
want=("${build[@]}")
[ "${1:-}" = "--build" ] || want+=("${tests[@]}")
command -v cargo >/dev/null 2>&1 || [ "${1:-}" = "--build" ] || want+=(cargo)

missing=()
for p in "${want[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [ "$status" = "install ok installed" ] || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#want[@]} packages present"
  exit 0
fi
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "install-deps: installing ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null

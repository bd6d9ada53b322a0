#!/usr/bin/env bash
# Every test of libwsync on a fresh Debian 12 machine: installs dependencies, then
#   1. builds and runs the CTest suite (cmocka specs, header, exports, install, CLI smoke),
#   2. builds the .deb packages and checks what each contains,
#   3. runs the Python binding's tests, the vLLM backend's tests against the real vLLM 0.33.0
#      (scripts/test-vllm.sh, its own venv) and the Rust binding's tests against the fresh build,
#   4. rebuilds with AddressSanitizer + UndefinedBehaviorSanitizer and runs the suite again,
#   5. runs each libFuzzer target briefly (WSYNC_FUZZ_SECONDS, default 30) from its seeds.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
jobs=$(nproc)
section() { printf '\n==== %s ====\n' "$*"; }
# A stage that runs no test fails (issue 36): ctest says "No tests were found!!!" and exits 0, so
# a build/ left configured with WSYNC_BUILD_TESTS=OFF passed the CTest stage having run nothing.
# Every ctest here has --no-tests=error; ctest_count LOG also reads the count from the summary
# ("... tests failed out of N") and fails unless N > 0.
ctest_count() {
  local n
  n=$(sed -n 's/.*tests failed out of \([0-9][0-9]*\).*/\1/p' "$1" | tail -1)
  [ "${n:-0}" -gt 0 ] || { echo "test-all: CTest ran no test (summary in $1)" >&2; exit 1; }
  echo "ctest: $n tests ran"
}
# pytest exits 5 when it collects no test; say so instead of stopping without a word.
run_pytest() {
  local rc=0
  "$@" || rc=$?
  [ "$rc" -ne 5 ] || echo "test-all: pytest collected no test: $*" >&2
  [ "$rc" -eq 0 ] || exit "$rc"
}

section "dependencies"
scripts/install-deps.sh

section "build and CTest"
# Every option on the command line: a CMake cache keeps what an earlier configure of build/ set
# (tests off, sanitizers), and this build must have tests, the tool (CLI smoke tests, the fake-GPU
# stage) and tests/fake_gpu whatever configured it before.
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DWSYNC_BUILD_TESTS=ON -DWSYNC_BUILD_TOOLS=ON \
  -DWSYNC_BUILD_FUZZERS=OFF -DWSYNC_SANITIZE= >/dev/null
cmake --build build -j"$jobs"
(cd build && ctest --output-on-failure --no-tests=error -j2) | tee build/ctest-summary.log
ctest_count build/ctest-summary.log

section "Debian packages"
(cd build && cpack -G DEB >/dev/null)
for pkg in libwsync0 libwsync-dev wsync-tools; do
  deb=$(ls build/${pkg}_*.deb)
  echo "$deb:"; dpkg-deb -c "$deb" > build/deb-contents.txt
  awk '{print "  " $6}' build/deb-contents.txt | grep -v '/$' || true
done
# List each package once (grep -q on a pipe would SIGPIPE dpkg-deb and trip pipefail).
runtime_files=$(dpkg-deb -c build/libwsync0_*.deb)
dev_files=$(dpkg-deb -c build/libwsync-dev_*.deb)
for want in libwsync.so.0; do
  grep -q "$want" <<<"$runtime_files" || { echo "libwsync0 lacks $want"; exit 1; }
done
multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH)
for want in "usr/lib/$multiarch/libwsync.so.0" usr/share/doc/libwsync0/copyright; do
  grep -q "$want" <<<"$runtime_files" || { echo "libwsync0 lacks $want"; exit 1; }
done
for want in include/wsync.h "lib/$multiarch/libwsync.a" "lib/$multiarch/pkgconfig/wsync.pc" \
            "lib/$multiarch/cmake/wsync/wsyncConfig.cmake"; do
  grep -q "$want" <<<"$dev_files" || { echo "libwsync-dev lacks $want"; exit 1; }
done
# shlibs for dependants; the library stripped, its debug symbols in libwsync0-dbgsym.
dpkg-deb --ctrl-tarfile build/libwsync0_*.deb | tar -xO ./shlibs | tee build/deb-shlibs.txt
grep -q "^libwsync 0 libwsync0 (>= " build/deb-shlibs.txt
deb_root=$(mktemp -d)
dpkg-deb -x build/libwsync0_*.deb "$deb_root"
dpkg-deb -x build/libwsync-dev_*.deb "$deb_root"
! readelf -S "$deb_root/usr/lib/$multiarch/libwsync.so.0" | grep -q '\.debug_info' \
  || { echo "libwsync.so.0 in libwsync0 is not stripped"; exit 1; }
! readelf -S "$deb_root/usr/lib/$multiarch/libwsync.a" | grep -q '\.debug_info' \
  || { echo "libwsync.a in libwsync-dev is not stripped"; exit 1; }
build_id=$(readelf -n "$deb_root/usr/lib/$multiarch/libwsync.so.0" | sed -n 's/.*Build ID: //p')
dbgsym_files=$(dpkg-deb -c build/libwsync0-dbgsym_*.ddeb)
grep -q "${build_id:2}.debug" <<<"$dbgsym_files" \
  || { echo "libwsync0-dbgsym lacks the debug file of build id $build_id"; exit 1; }
rm -rf "$deb_root"
# Debian's checks on every package; errors fail, warnings are overridden with their reason in
# cmake/debian/*.lintian-overrides (lintian warns about running as root: not a finding).
lint_rc=0
lintian --fail-on error,warning build/*.deb build/*.ddeb > build/lintian.txt 2>&1 || lint_rc=$?
grep -v 'running with root' build/lintian.txt || true
[ "$lint_rc" -eq 0 ] || { echo "lintian found errors or warnings"; exit 1; }
echo "lintian: no errors or warnings"
# (Only where no libwsync0 is installed: "ok installed", not a removed package's leftover record.)
if [ "$(id -u)" -eq 0 ] && ! dpkg-query -W -f='${Status}' libwsync0 2>/dev/null | grep -q 'ok installed'; then
  # As a user would: apt install the packages, build against the system copy, remove them.
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq ./build/libwsync0_*.deb \
    ./build/libwsync-dev_*.deb ./build/wsync-tools_*.deb >/dev/null
  pkg-config --atleast-version="$(pkg-config --modversion wsync | cut -d. -f1,2)" wsync
  cc -std=c99 tests/install/consumer/consumer.c $(pkg-config --cflags --libs wsync) -o build/consumer-deb
  build/consumer-deb
  # A package built against it would depend on libwsync0 (>= this version), from shlibs.
  mkdir -p build/shlibdeps-check/debian && touch build/shlibdeps-check/debian/control
  (cd build/shlibdeps-check && dpkg-shlibdeps -O ../consumer-deb) | tee build/deb-shlibdeps.txt
  grep -q "libwsync0 (>= " build/deb-shlibdeps.txt
  wsync --version
  DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq wsync-tools libwsync-dev libwsync0 >/dev/null
fi

if [ -d bindings/python ]; then
  section "Python binding"
  # (On the binding's folder, not its tests': a binding whose tests went missing fails here.)
  WSYNC_LIBRARY="$root/build/libwsync.so" run_pytest /usr/bin/python3 -m pytest -q -p no:cacheprovider bindings/python/tests
fi

section "Python package: wheel with the library bundled, installed into a fresh venv"
WSYNC_LIBRARY="$root/build/libwsync.so" scripts/test-install.sh

section "vLLM backend (real vllm==0.33.0, CPU)"
WSYNC_LIBRARY="$root/build/libwsync.so" scripts/test-vllm.sh

# These layer their venvs on the vLLM venv above (a .pth line), so torch and vllm come once.
section "verl checkpoint engine (real verl==0.9.1, CPU)"
WSYNC_LIBRARY="$root/build/libwsync.so" run_pytest scripts/test-verl.sh

section "TRL weight transfer (real trl==1.16.0 on vllm==0.33.0, CPU)"
WSYNC_LIBRARY="$root/build/libwsync.so" run_pytest scripts/test-trl.sh

section "SGLang custom loader (real sglang==0.5.23 weight-update path, CPU)"
WSYNC_LIBRARY="$root/build/libwsync.so" run_pytest scripts/test-sglang.sh

section "GPU validation: the fake-driver twin of scripts/gpu-validate.sh"
# The same steps a GPU machine runs (gpu CTest label, Python GPU tests, cuda_ipc bench, baseline),
# against tests/fake_gpu; hardware-only steps skip with their reason.
# The record is appended to, so the last verdict is this run's (a `grep -q ... &&` on the whole
# file passed on an earlier run's PASS, and a failed && does not stop a set -e script).
PYTHON=/usr/bin/python3 scripts/gpu-validate.sh --fake --build-dir build > build/gpu-validate-fake.log 2>&1 \
  || { cat build/gpu-validate-fake.log; exit 1; }
grep '^Verdict:' build/gpu-validation-fake.md | tail -1 | grep -q '^Verdict: PASS' \
  || { cat build/gpu-validate-fake.log; echo "test-all: the fake-GPU validation's verdict is not PASS"; exit 1; }
tail -8 build/gpu-validation-fake.md

if [ -f bindings/rust/Cargo.toml ]; then
  section "Rust binding"
  # --features wsync/half: the optional bf16/f16 types are tested too.
  (cd bindings/rust && WSYNC_LIB_DIR="$root/build" LD_LIBRARY_PATH="$root/build" \
     cargo test --offline --quiet --features wsync/half 2>&1) | tee build/cargo-test.log
  # Each test binary (unit, integration, doc tests) ends with "test result: ok. N passed; ...";
  # cargo passes when all of them ran 0, so the sum must be > 0.
  rust_tests=$(sed -n 's/^test result: ok\. \([0-9][0-9]*\) passed.*/\1/p' build/cargo-test.log \
    | awk '{s += $1} END {print s + 0}')
  [ "$rust_tests" -gt 0 ] || { echo "test-all: cargo test ran no test" >&2; exit 1; }
  echo "cargo test: $rust_tests tests passed"
  # Lints as errors, pedantic included (issue 14), also in the docs-only mode (DOCS_RS: no
  # library, a header-less build); a toolchain without clippy skips it.
  if (cd bindings/rust && cargo clippy --version >/dev/null 2>&1); then
    (cd bindings/rust && WSYNC_LIB_DIR="$root/build" LD_LIBRARY_PATH="$root/build" \
       cargo clippy --offline --all-targets --quiet --features wsync/half -- -D warnings -W clippy::pedantic 2>&1)
    (cd bindings/rust && DOCS_RS=1 \
       cargo clippy --offline --all-targets --quiet --features wsync/half -- -D warnings -W clippy::pedantic 2>&1)
  else
    echo "clippy: skipped (cargo clippy --version failed: no clippy in this toolchain)"
  fi
fi

section "README code blocks and a new Rust user's first crate"
# Every Python block of README.md and bindings/python/README.md runs and every C block of
# README.md compiles (test_readme.py); every Rust block of README.md and bindings/rust/README.md
# runs against the Python blocks as its peers (tests/readme.rs). Both also ran in the stages
# above; here each must have run tests of its own (issue 39), ~25 s.
WSYNC_LIBRARY="$root/build/libwsync.so" run_pytest /usr/bin/python3 -m pytest -q -p no:cacheprovider \
  bindings/python/tests/test_readme.py
if [ -f bindings/rust/Cargo.toml ]; then
  # (WSYNC_README_NEED_PYTHON: a Python without torch fails here instead of skipping the peers.)
  (cd bindings/rust && WSYNC_LIB_DIR="$root/build" LD_LIBRARY_PATH="$root/build" WSYNC_README_NEED_PYTHON=1 \
     cargo test --offline --quiet --features wsync/half --test readme 2>&1) | tee build/cargo-readme.log
  readme_tests=$(sed -n 's/^test result: ok\. \([0-9][0-9]*\) passed.*/\1/p' build/cargo-readme.log \
    | awk '{s += $1} END {print s + 0}')
  [ "$readme_tests" -gt 0 ] || { echo "test-all: the README's Rust blocks ran no test" >&2; exit 1; }
  echo "README Rust blocks: $readme_tests tests passed"
  # A fresh crate depending on wsync alone, built and run with no environment variables.
  scripts/test-rust-consumer.sh
fi

section "AddressSanitizer + UndefinedBehaviorSanitizer"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DWSYNC_SANITIZE=address,undefined \
  -DWSYNC_BUILD_TESTS=ON -DWSYNC_BUILD_TOOLS=ON -DWSYNC_BUILD_FUZZERS=OFF >/dev/null
cmake --build build-asan -j"$jobs" >/dev/null
# The install test builds an uninstrumented consumer, which cannot load an instrumented library.
# intercept_tls_get_addr=0: up to GCC 13 / LLVM 16 the sanitizer runtime's __tls_get_addr
# interceptor takes a dynamic TLS block that happens to start 16 bytes into a page for a
# pre-glibc-2.25 block with a header, reads the two words before it as that block's start and
# size, and LeakSanitizer's tracer then faults scanning that made-up range at exit ("Tracer caught
# signal 11"). Any process that dlopens a library with thread-locals (UCX does) can hit it by
# chance; it failed ucx_loopback.tp_shards in one CI run out of many. Debian 12 ships GCC 12.
# Without the interceptor LSan does not scan dynamic TLS blocks, so a pointer held only there
# would read as a leak: none does in this suite.
export ASAN_OPTIONS=detect_leaks=1:intercept_tls_get_addr=0
(cd build-asan && ctest --output-on-failure --no-tests=error -j2 -LE install) \
  | tee build-asan/ctest-summary.log
ctest_count build-asan/ctest-summary.log

section "fuzzing"
CC=clang-14 CXX=clang++-14 cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DWSYNC_BUILD_FUZZERS=ON -DWSYNC_SANITIZE=address,undefined -DWSYNC_BUILD_TESTS=OFF \
  -DWSYNC_BUILD_TOOLS=OFF >/dev/null
cmake --build build-fuzz -j"$jobs" >/dev/null
# fuzz_request makes a segment per input; libFuzzer's time limit ends the process without
# exit handlers, so a segment of the input it cut short is removed here afterwards.
shm_before=$(ls /dev/shm)
# Its seeds must pass every check for both of its receivers (plain and mirror), or the fuzzer
# would only ever mutate a refusal.
WSYNC_FUZZ_SEEDS_MUST_PASS=1 build-fuzz/tests/fuzz/fuzz_request -runs=0 tests/fuzz/corpus/request \
  >/dev/null 2>build-fuzz/request-seeds.log \
  || { cat build-fuzz/request-seeds.log; echo "fuzz_request: a seed is refused"; exit 1; }
for t in describe init request request_oracle options ucx_wire; do
  seeds=tests/fuzz/corpus/$t; [ "$t" = describe ] && seeds=tests/fuzz/corpus/blob
  corpus=$(mktemp -d); cp "$seeds"/* "$corpus"/
  echo "fuzz_$t: ${WSYNC_FUZZ_SECONDS:-30} s"
  build-fuzz/tests/fuzz/fuzz_$t -max_total_time="${WSYNC_FUZZ_SECONDS:-30}" -rss_limit_mb=2048 \
    -print_final_stats=0 "$corpus" 2>&1 | grep -E 'DONE|ERROR|SUMMARY' || true
  # libFuzzer exits non-zero on any crash, leak or sanitizer report.
  build-fuzz/tests/fuzz/fuzz_$t -runs=0 "$corpus" >/dev/null 2>&1
  rm -rf "$corpus"
done
for f in $(ls /dev/shm); do
  case "$f" in wsync-*) grep -qx "$f" <<<"$shm_before" || rm -f "/dev/shm/$f" ;; esac
done

section "result"
# Every stage above stops the script on failure, so reaching here means all passed.
total=$(sed -n 's/.*tests failed out of \([0-9]*\).*/\1/p' build/ctest-summary.log build-asan/ctest-summary.log | awk '{s += $1} END {print s}')
echo "all test stages passed (CTest, packages, bindings present, sanitizers, fuzzers)"
# CTest counts a skipped test (a GPU test on a machine without one) among those that passed.
skipped=$(cat build/ctest-summary.log build-asan/ctest-summary.log | grep -c '\*\*\*Skipped' || true)
echo "ctest: $((total - skipped)) passed, 0 failed, $skipped skipped"

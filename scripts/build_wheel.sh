#!/usr/bin/env bash
# Builds a wheel of this tree, then checks it as a user would get it: its size and build time,
# auditwheel's verdict, a repair to the most widely compatible manylinux tag this machine's
# toolchain allows (libgomp and anything else outside the manylinux set vendored into the
# wheel), and an install into a scratch venv that imports the module and runs the program.
#
#   bash scripts/build_wheel.sh cpu [OUT_DIR]    # CPU-only wheel (CI runs this)
#   bash scripts/build_wheel.sh cuda [OUT_DIR]   # CUDA wheel: sm_80 + sm_90a, every instantiation
#   bash scripts/build_wheel.sh cuda-minimal      # the CUDA wheel with one instantiation (bf16, d 128,
#                                                 # sm_80): the CUDA variant's packaging path in CI time
#
# OUT_DIR (default dist/) receives raw/ (pip's wheel) and the repaired wheel. The CPU variant
# builds in the folder scripts/test.sh's `pip install .` used (same settings on a machine without
# a GPU), so after test.sh it only relinks. A manylinux_2_28 wheel needs the manylinux_2_28
# image (its older glibc); see README.md's Wheels section.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VARIANT="${1:-cpu}"
OUT="$(mkdir -p "${2:-$ROOT/dist}" && cd "${2:-$ROOT/dist}" && pwd)"

settings=()
case "$VARIANT" in
  cpu) settings+=(-C cmake.define.KVFLASH_CUDA=OFF) ;;
  cuda) settings+=(-C cmake.define.KVFLASH_CUDA=ON -C cmake.define.KVFLASH_CUDA_MINIMAL=OFF
                   -C build-dir="$ROOT/build/wheel-cuda") ;;
  cuda-minimal) settings+=(-C cmake.define.KVFLASH_CUDA=ON -C cmake.define.KVFLASH_CUDA_MINIMAL=ON
                           -C build-dir="$ROOT/build/wheel-cuda-minimal") ;;
  *) echo "build_wheel.sh: variant must be cpu, cuda or cuda-minimal, got '$VARIANT'" >&2; exit 2 ;;
esac

rm -rf "$OUT/raw"
start=$(date +%s)
# -v: the build's [n/N] progress lines reach the log (the whole log: OUT/build-VARIANT.log).
# --no-build-isolation: the pinned scikit-build-core/nanobind that scripts/install.sh installed.
log="$OUT/build-$VARIANT.log"
set +e
(cd "$ROOT" && python3 -m pip wheel . --no-deps --no-build-isolation --disable-pip-version-check \
  -v -w "$OUT/raw" "${settings[@]}") 2>&1 | tee "$log" | grep --line-buffered -E '^ *\[[0-9]+/[0-9]+\]|Created wheel'
status=${PIPESTATUS[0]}
set -e
if [ "$status" -ne 0 ]; then
  tail -40 "$log" >&2
  echo "build_wheel.sh: pip wheel failed (status $status); whole log: $log" >&2
  exit 1
fi
seconds=$(( $(date +%s) - start ))
raw=$(ls "$OUT"/raw/kvflash-*.whl)
echo "build_wheel.sh: $(basename "$raw"): $(du -k "$raw" | cut -f1) KiB, built in ${seconds} s"

# auditwheel names the most compatible policy the wheel's symbols allow; repair to it.
show=$(python3 -m auditwheel show "$raw")
echo "$show"
policy=$(echo "$show" | grep -o 'manylinux_[0-9]*_[0-9]*_x86_64' | head -1)
[ -n "$policy" ] || { echo "build_wheel.sh: auditwheel found no manylinux policy" >&2; exit 1; }
rm -f "$OUT"/kvflash-*"$policy"*.whl
python3 -m auditwheel repair --plat "$policy" -w "$OUT" "$raw" | tail -1
wheel=$(ls "$OUT"/kvflash-*"$policy"*.whl)
echo "build_wheel.sh: $(basename "$wheel"): $(du -k "$wheel" | cut -f1) KiB"

# The repaired wheel in a scratch venv (numpy and ml_dtypes from this Python's site-packages).
venv="$(mktemp -d)"
trap 'rm -rf "$venv"' EXIT
python3 -m venv --system-site-packages "$venv"
# --ignore-installed: test.sh may have put kvflash in the system site-packages this venv sees.
"$venv/bin/python" -m pip install --quiet --no-deps --ignore-installed --disable-pip-version-check "$wheel"
(cd "$venv" && "$venv/bin/python" -c "import kvflash; print('build_wheel.sh: import kvflash', kvflash.__version__, kvflash.build_backends())")
if [ "$VARIANT" != cpu ]; then  # a CUDA wheel says so, and (without a GPU here) still runs on the CPU
  (cd "$venv" && "$venv/bin/python" -c "import kvflash; assert 'cuda' in kvflash.build_backends().split(','), kvflash.build_backends()")
fi
"$venv/bin/kvflash" --version
"$venv/bin/kvflash" check --cases 5 >/dev/null
echo "build_wheel.sh: $VARIANT wheel ok: $wheel"

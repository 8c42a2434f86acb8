#!/usr/bin/env bash
# AddressSanitizer + UndefinedBehaviorSanitizer run of the C kernels (issue 8).
#
#   tools/sanitize_tests.sh                 # kernel, attention, cache, pool, tokenizer, loader and layer-loop tests
#   tools/sanitize_tests.sh --fuzz 120      # ... and 120 s of the structured fuzzer on the sanitized build
#   tools/sanitize_tests.sh -- -k gemv      # extra pytest arguments after --
#
# The working tree (tracked and untracked, not ignored files) is copied to $G4_SAN_DIR (default
# /tmp/gemma4cpu-asan) and built there with GEMMA4CPU_SANITIZE=1 (setup.py: -fsanitize=address,undefined
# -fno-omit-frame-pointer -g, -O1), so the in-place build of the checkout is never touched. The tests run
# from the copy in a separate virtual environment that sees the packages of $PYTHON's environment
# (numpy, pytest, gguf, ...) but not its editable gemma4cpu, with libasan and libubsan preloaded (the
# interpreter itself is not instrumented). Any sanitizer report fails the run (halt_on_error); leak
# checking is off because the interpreter's own allocations at exit would drown the report.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-$ROOT/.venv/bin/python}
[ -x "$PY" ] || PY=$(command -v python3)
SAN=${G4_SAN_DIR:-/tmp/gemma4cpu-asan}
FUZZ=0
if [ "${1:-}" = "--fuzz" ]; then FUZZ=$2; shift 2; fi
[ "${1:-}" = "--" ] && shift
TESTS=(tests/test_blocks.py tests/test_dequant.py tests/test_quant.py tests/test_kernels.py tests/test_ops.py
       tests/test_flash_attn.py tests/test_kv_cache.py tests/test_pool.py tests/test_dispatch.py
       tests/test_tokenizer.py tests/test_gguf_io.py tests/test_hostile_files.py tests/test_fuzz.py
       tests/test_layer_loop_synth.py tests/test_q4k_r8.py)

t0=$(date +%s)
echo "sanitizer build in $SAN (from $ROOT, python $PY)"
mkdir -p "$SAN"
# refresh the sources (keep build/ so an unchanged tree rebuilds quickly)
(cd "$ROOT" && git ls-files -co --exclude-standard | while IFS= read -r f; do [ -f "$f" ] && printf '%s\n' "$f"; done) \
  | tar -C "$ROOT" -cf - -T - | tar -C "$SAN" -xf -

VENV="$SAN/.venv-san"
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -c 'import sys; sys.exit(0)'
  BASE=$("$PY" -c 'import sys; print(sys.base_prefix)')
  "$BASE/bin/python3" -m venv "$VENV"
fi
DEV_SITE=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
SAN_SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$DEV_SITE" > "$SAN_SITE/_gemma4cpu_dev_site.pth"     # a plain path line: the editable finder is not run
"$VENV/bin/python" -c 'import Cython' 2>/dev/null || "$VENV/bin/python" -m pip install -q "cython>=3.0,<4"

cd "$SAN"
rm -f gemma4cpu/_kernels*.so
GEMMA4CPU_SANITIZE=1 nice -n 19 "$VENV/bin/python" setup.py -q build_clib build_ext --inplace 2>&1 \
  | grep -v -e "^warning: no previously-included" -e "^$" || true
t1=$(date +%s)

ASAN_LIB=$(gcc -print-file-name=libasan.so)
UBSAN_LIB=$(gcc -print-file-name=libubsan.so)
export LD_PRELOAD="$ASAN_LIB:$UBSAN_LIB"
export ASAN_OPTIONS=detect_leaks=0:halt_on_error=1:abort_on_error=1:detect_stack_use_after_return=1:strict_string_checks=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
export PYTHONDONTWRITEBYTECODE=1

"$VENV/bin/python" - <<'EOF'
import gemma4cpu._kernels as k, os, sys
here = os.path.dirname(os.path.dirname(os.path.abspath(k.__file__)))
if here != os.getcwd():
    sys.exit(f"the sanitized run imports {k.__file__}, not the build in {os.getcwd()}")
syms = open(k.__file__, "rb").read()
if b"__asan_report" not in syms or b"__ubsan_handle" not in syms:
    sys.exit(f"{k.__file__} is not instrumented")
print(f"sanitized extension: {k.__file__}")
EOF

nice -n 19 "$VENV/bin/python" -m pytest -q -p no:cacheprovider "${TESTS[@]}" "$@"
t2=$(date +%s)
if [ "$FUZZ" != "0" ]; then
  nice -n 19 "$VENV/bin/python" tools/fuzz_gguf.py --engine random --seconds "$FUZZ" --workers 1 --save-current \
    --out "$SAN/fuzz-out"
fi
t3=$(date +%s)
echo "sanitizer run clean: build $((t1 - t0)) s, tests $((t2 - t1)) s, fuzz $((t3 - t2)) s"

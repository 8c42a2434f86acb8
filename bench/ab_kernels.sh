#!/bin/bash
# A/B timing of one ISA's gemm kernels: the working tree's csrc/ against a git revision's, on one
# pinned CPU, the two binaries alternated ROUNDS times and the best time of each kept (a shared,
# noisy host moves both alike; a ratio of minima is what this measures). Also checks that both
# builds give the same output bytes (hash), which every kernel change here must keep.
#
#   bench/ab_kernels.sh [-r REV] [-i ISA] [-c CPU] [-n ROUNDS] [-A FLAGS] [-B FLAGS] [-t CPUS [-p PAIRS]] TYPE K ROWS NTOK...
#   bench/ab_kernels.sh q4_K 5376 128 1 4 16            # L2-resident rows, HEAD vs working tree
#   bench/ab_kernels.sh -r HEAD~3 -i avx2 q6_K 5376 128 1
#   REPS=3 bench/ab_kernels.sh -r . -i avx512 -A -DG4X_KSTREAM=0 q4_K 5376 24966 1   # a knob, 1 GiB
#   bench/ab_kernels.sh -r . -i avx512 -A -DG4X_KSTREAM=0 -t 0,1 q4_K 5376 200000 1  # 2 threads, in process
#
# -r . takes the working tree for "old" too; -A / -B add compile flags (e.g. -D knobs) to the old /
# new build. REPS (environment) = calls per alternation (default 1000; 3 for weights from memory).
# -t CPUS (comma-separated): both builds as shared libraries in one process (bench/kernel_pair.c),
# one pinned thread per CPU splitting each call by rows, calls alternating old / new PAIRS times
# (default 15): prints each build's median time and the median of the per-pair ratios new/old,
# which on a host whose bandwidth moves between runs is the figure to read.
# TYPE: q4_0 q5_0 q8_0 q4_K q5_K q6_K. ISA: avx2 (default) or avx512. The libraries are built
# with the compile flags of setup.py (BASE + -O3 + the ISA's flags; kept in step by hand).
set -euo pipefail
REV=HEAD ISA=avx2 CPU=0 ROUNDS=5 REPS=${REPS:-1000}
XA="" XB="" TCPUS="" PAIRS=15
while getopts "r:i:c:n:A:B:t:p:h" o; do
  case $o in
    r) REV=$OPTARG ;; i) ISA=$OPTARG ;; c) CPU=$OPTARG ;; n) ROUNDS=$OPTARG ;; A) XA=$OPTARG ;; B) XB=$OPTARG ;;
    t) TCPUS=$OPTARG ;; p) PAIRS=$OPTARG ;;
    *) sed -n '2,21p' "$0"; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
if [ $# -lt 4 ]; then sed -n '2,21p' "$0"; exit 2; fi
TYPE=$1 K=$2 ROWS=$3; shift 3
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BASE="-std=c11 -ffp-contract=off -fPIC -fno-strict-aliasing -O3"
case $ISA in
  avx2) FLAGS="-mavx2 -mfma -mf16c -mbmi2" ;;
  avx512) FLAGS="-mavx2 -mfma -mf16c -mbmi2 -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni" ;;
  *) echo "ISA must be avx2 or avx512" >&2; exit 2 ;;
esac
if [ "$ISA" = avx512 ] && ! grep -qE "avx512_?vnni" /proc/cpuinfo; then
  echo "this CPU cannot run the avx512 table (no AVX-512 VNNI in /proc/cpuinfo)" >&2; exit 2
fi
CC=${CC:-cc}
WORK=$(mktemp -d /tmp/g4ab.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

compile() { # compile SRC_ROOT OUT [EXTRA]: the ISA's and the reference products and quantisers -> OBJS
  local src=$1 out=$2 extra=${3:-}
  OBJS=()
  for c in "$src"/csrc/ref/gemm*.c "$src"/csrc/ref/quant*.c; do
    $CC $BASE -O2 -I"$src/csrc" -c "$c" -o "$out.ref.$(basename "$c" .c).o"; OBJS+=("$out.ref.$(basename "$c" .c).o")
  done
  for c in "$src"/csrc/"$ISA"/gemm*.c "$src"/csrc/"$ISA"/quant*.c; do
    # shellcheck disable=SC2086
    $CC $BASE $FLAGS $extra -I"$src/csrc" -c "$c" -o "$out.isa.$(basename "$c" .c).o"; OBJS+=("$out.isa.$(basename "$c" .c).o")
  done
}
build() { # build SRC_ROOT OUT [EXTRA]: those objects linked with kernel_micro.c
  compile "$@"
  $CC -O2 -DG4_ISA="$ISA" "$ROOT/bench/kernel_micro.c" "${OBJS[@]}" -lm -o "$2"
}
build_so() { # build_so SRC_ROOT OUT [EXTRA]: the same objects as one shared library (kernel_pair.c)
  compile "$@"
  $CC -shared "${OBJS[@]}" -lm -o "$2"
}

if [ "$REV" = . ]; then
  OLDSRC=$ROOT OLDDESC="working tree"
else
  mkdir -p "$WORK/old"
  git -C "$ROOT" archive "$REV" csrc | tar -x -C "$WORK/old"
  OLDSRC=$WORK/old OLDDESC="$REV ($(git -C "$ROOT" rev-parse --short "$REV"))"
fi
if [ -n "$TCPUS" ]; then
  build_so "$OLDSRC" "$WORK/old.so" "$XA"
  build_so "$ROOT" "$WORK/new.so" "$XB"
  $CC -O2 -pthread "$ROOT/bench/kernel_pair.c" -ldl -o "$WORK/kp"
  echo "A/B $ISA in one process: old = $OLDDESC${XA:+ [$XA]}, new = working tree${XB:+ [$XB]}; threads on CPUs $TCPUS;" \
       "$PAIRS alternating pairs;$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)"
  for NT in "$@"; do "$WORK/kp" "$WORK/old.so" "$WORK/new.so" "$ISA" "$TYPE" "$K" "$ROWS" "$NT" "$PAIRS" "$TCPUS"; done
  exit 0
fi
build "$OLDSRC" "$WORK/km_old" "$XA"
build "$ROOT" "$WORK/km_new" "$XB"
echo "A/B $ISA: old = $OLDDESC${XA:+ [$XA]}, new = working tree${XB:+ [$XB]}; CPU $CPU;" \
     "$ROUNDS alternations x $REPS calls, minimum kept; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)"
for NT in "$@"; do
  o=1e30 n=1e30 ho="" hn=""
  for _ in $(seq "$ROUNDS"); do
    a=$(taskset -c "$CPU" "$WORK/km_old" "$TYPE" "$K" "$ROWS" "$NT" "$REPS")
    b=$(taskset -c "$CPU" "$WORK/km_new" "$TYPE" "$K" "$ROWS" "$NT" "$REPS")
    o=$(python3 -c "print(min($o, $(sed 's/.* ms, \([0-9.]*\) ns.*/\1/' <<<"$a")))")
    n=$(python3 -c "print(min($n, $(sed 's/.* ms, \([0-9.]*\) ns.*/\1/' <<<"$b")))")
    ho=${a##*hash } hn=${b##*hash }
  done
  same=$([ "$ho" = "$hn" ] && echo "same output" || echo "OUTPUT DIFFERS ($ho vs $hn)")
  python3 -c "print(f'$TYPE k=$K rows=$ROWS ntok=$NT: old {$o:.4f} new {$n:.4f} ns per row-token-32block, new/old {$n / $o:.3f}; $same')"
done

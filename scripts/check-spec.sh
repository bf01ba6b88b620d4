#!/usr/bin/env bash
# Model-check the P/D transfer protocol model spec/pd_transfer.pml and the
# broadcast ring spec/broadcast_ring.pml with Spin.
#
#   bash scripts/check-spec.sh        (from any directory)
#
# 1. The model, for each mode (WRITE, READ): a safety run (assertions and
#    invalid end states) and one liveness run per LTL formula (p_released,
#    d_released, request_ends: acceptance cycles under weak fairness).  Each
#    must report errors: 0.
# 2. The mutations (known-bad variants of the protocol, see the model's
#    header): each must be caught, i.e. its run must report errors > 0.
# 3. Reachability probes: each must be reached, so that the passing runs do
#    not pass because a path of the protocol is dead.
# Exit 0 only when all three hold.  One summary line per run: what, mode,
# property, states stored, pan's search time, result.
#
# spin -a runs once and pan is compiled twice (safety: -DSAFETY -DNOCLAIM;
# liveness: -DNFAIR=3; gcc -O2, in parallel) from the model built with
# -DRUNTIME_SELECT; each run picks mode, mutation and probe through
# PD_SPEC_MODE / PD_SPEC_MUT / PD_SPEC_PROBE, which select the same code as the
# -DMODE_* / -DMUT_* / -DPROBE= macros.  Full state-space search (no
# -DBITSTATE).  Everything happens in a mktemp -d directory, removed on exit.
#
# Knobs (environment): MAXFAULTS (network faults per run, default 2),
# MAXDISRUPT (disruptions armed per run, default 1), QSZ (channel capacity,
# default 5), HASHW (pan -w, default 22), SPIN, CC.  E.g. MAXDISRUPT=2 QSZ=6
# (about 75 s) or MAXFAULTS=3 QSZ=6 (about 65 s) for deeper checks.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SPEC="$ROOT/spec/pd_transfer.pml"
SPIN="${SPIN:-spin}"
CC="${CC:-gcc}"
MAXFAULTS="${MAXFAULTS:-2}"
MAXDISRUPT="${MAXDISRUPT:-1}"
QSZ="${QSZ:-5}"
HASHW="${HASHW:-22}"   # pan -w: 2^22 hash slots (enough for a few million states)
DEPTH=20000

for tool in "$SPIN" "$CC"; do
  command -v "$tool" >/dev/null 2>&1 || { echo "check-spec: '$tool' not found" >&2; exit 2; }
done
[[ -f "$SPEC" ]] || { echo "check-spec: $SPEC not found" >&2; exit 2; }
unset PD_SPEC_MODE PD_SPEC_MUT PD_SPEC_PROBE

TMP="$(mktemp -d "${TMPDIR:-/tmp}/pd-spec.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT

T0=$SECONDS
echo "Spin model check of $SPEC"
echo "MAXFAULTS=$MAXFAULTS MAXDISRUPT=$MAXDISRUPT QSZ=$QSZ, full search, gcc -O2"

# ---- build: spin -a once, gcc twice (in parallel) --------------------------
cp "$SPEC" "$TMP/pd_transfer.pml"
( cd "$TMP" &&
  "$SPIN" -DRUNTIME_SELECT -DMAXFAULTS="$MAXFAULTS" -DMAXDISRUPT="$MAXDISRUPT" \
          -DQSZ="$QSZ" -a pd_transfer.pml >spin.log 2>&1 ) ||
  { echo "check-spec: spin -a failed" >&2; cat "$TMP/spin.log" >&2; exit 1; }
( cd "$TMP" && "$CC" -O2 -DSAFETY -DNOCLAIM -o pan.safety pan.c >cc.safety.log 2>&1 ) &
pid_safety=$!
( cd "$TMP" && "$CC" -O2 -DNFAIR=3 -o pan.live pan.c >cc.live.log 2>&1 ) &
pid_live=$!
build_ok=1
wait "$pid_safety" || { build_ok=0; cat "$TMP/cc.safety.log" >&2; }
wait "$pid_live" || { build_ok=0; cat "$TMP/cc.live.log" >&2; }
(( build_ok )) || { echo "check-spec: gcc failed" >&2; exit 1; }
echo "build: $((SECONDS - T0)) s"

# run MODE MUT PROPERTY: sets ERRORS STATES SECS REASON
run() {
  local mode="$1" mut="$2" prop="$3" out bin args=()
  out="$TMP/$mode.${mut:-model}.$prop.${PD_SPEC_PROBE:-0}.out"
  if [[ "$prop" == safety ]]; then
    bin=./pan.safety
  else
    bin=./pan.live; args=(-a -f -N "$prop")
  fi
  ( cd "$TMP" && PD_SPEC_MODE="$mode" PD_SPEC_MUT="$mut" PD_SPEC_PROBE="${PD_SPEC_PROBE:-0}" \
      nice -n 10 "$bin" -m"$DEPTH" -w"$HASHW" "${args[@]}" >"$out" 2>&1 ) || true
  ERRORS="$(sed -n 's/.*errors: \([0-9][0-9]*\).*/\1/p' "$out" | tail -n1)"
  STATES="$(sed -n 's/^ *\([0-9.e+]*\) states, stored.*/\1/p' "$out" | tail -n1)"
  SECS="$(sed -n 's/^pan: elapsed time \([0-9.e+-]*\) seconds.*/\1/p' "$out" | tail -n1)"
  REASON="$(sed -n 's/^pan:1: \(.*\) (at depth.*/\1/p' "$out" | head -n1)"
  if [[ -z "$ERRORS" ]]; then
    ERRORS=-1; REASON="pan did not finish: $(tail -n1 "$out")"
  elif grep -q "max search depth too small" "$out"; then
    ERRORS=-1; REASON="search depth $DEPTH too small"
  fi
  : "${STATES:=?}" "${SECS:=?}"
}

line() { printf '%-38s %-6s %-13s states=%-8s time=%-6s %s\n' "$@"; }
FAILED=0

# ---- the model: everything must pass ---------------------------------------
for mode in WRITE READ; do
  for prop in safety p_released d_released request_ends; do
    run "$mode" "" "$prop"
    if [[ "$ERRORS" == 0 ]]; then
      res=PASS
    else
      res="FAIL (errors=$ERRORS: $REASON)"; FAILED=1
    fi
    line model "$mode" "$prop" "$STATES" "${SECS}s" "$res"
  done
done

# ---- the mutations: each must be caught -------------------------------------
# "MUTATION MODE PROPERTY": the run that should catch it; if it does not, the
# other runs are tried before the mutation is declared not caught.
MUTANTS=(
  "MUT_DEFER_EXPIRY WRITE d_released"          # field report bug 1
  "MUT_NO_WRITE_FAIL_MSG WRITE safety"         # write failure told to nobody
  "MUT_LOCAL_ID_RELEASE READ safety"           # Release with the decode-local id
  "MUT_ONE_TO_ONE_SIBLINGS WRITE safety"       # siblings clobber a 1:1 map
  "MUT_END_CANCELS_RETX WRITE safety"          # ending stops RemoteBlocks retransmits
  "MUT_FREE_WITHOUT_FENCE WRITE safety"        # a dead prefill's write lands in freed blocks
)
ALL_RUNS=("WRITE safety" "WRITE p_released" "WRITE d_released" "WRITE request_ends"
          "READ safety" "READ p_released" "READ d_released" "READ request_ends")
for m in "${MUTANTS[@]}"; do
  read -r mut mode prop <<<"$m"
  caught=0
  tries=("$mode $prop")
  for r in "${ALL_RUNS[@]}"; do [[ "$r" == "$mode $prop" ]] || tries+=("$r"); done
  for try in "${tries[@]}"; do
    read -r tmode tprop <<<"$try"
    run "$tmode" "$mut" "$tprop"
    if (( ERRORS > 0 )); then
      line "$mut" "$tmode" "$tprop" "$STATES" "${SECS}s" "CAUGHT ($REASON)"
      caught=1
      break
    fi
    line "$mut" "$tmode" "$tprop" "$STATES" "${SECS}s" "not caught (errors=$ERRORS)"
  done
  if (( caught == 0 )); then
    echo "check-spec: MUTATION NOT CAUGHT: $mut" >&2
    FAILED=1
  fi
done

# ---- reachability probes: each must be reached (the model is not vacuous) ---
PROBES=(
  "1 both  complete+max-faults"        # completes although MAXFAULTS faults hit
  "2 both  complete+all-freed"         # completes, both sides freed, both ended
  "3 both  draining+quarantined"       # both sides wait for each other's Release
  "4 both  siblings-ended"             # an abort ends both running siblings
  "5 both  drain-after-decode-death"   # prefill still drains after decode died
  "6 both  free-after-prefill-death"   # decode frees after the lease, request fails
  "7 both  prefill-ended-decode-admitting" # the prefill ended before the decode admitted
  "8 WRITE write-into-quarantine"      # the write lands in quarantined blocks
  "9 READ  read-in-flight-after-fence" # a dead decode's read outlives the prefill's fence
  "10 WRITE write-before-fence"        # a dead prefill's write lands while the fence is under way
  "11 WRITE fenced-write"              # a dead prefill's write arrives after the fence: it fails
)
for pr in "${PROBES[@]}"; do
  read -r num modes desc <<<"$pr"
  [[ "$modes" == both ]] && modes="WRITE READ"
  for mode in $modes; do
    PD_SPEC_PROBE="$num" run "$mode" "" safety
    if (( ERRORS > 0 )) && [[ "$REASON" == "assertion violated 0" ]]; then
      res=REACHED
    else
      res="NOT REACHED (errors=$ERRORS ${REASON})"; FAILED=1
    fi
    line "probe $num $desc" "$mode" "reachable" "$STATES" "${SECS}s" "$res"
  done
done

# ---- the broadcast ring (spec/broadcast_ring.pml): its own small model -----
# Each variant is its own spin -a build (they differ in macros); safety runs
# only (assertions and invalid end states = deadlock).  Must pass: the model
# without timeouts (wake-ups alone make progress) and with them.  Must fail:
# the two mutants.  Must be reached: probe 1 (the writer waits for a slot).
RING_SPEC="$ROOT/spec/broadcast_ring.pml"
ring_run() {  # ring_run NAME EXPECT FLAGS...: EXPECT pass|fail
  local name="$1" expect="$2" d="$TMP/ring.$1" out
  shift 2
  mkdir -p "$d" && cp "$RING_SPEC" "$d/"
  out="$d/pan.out"
  if ! ( cd "$d" && "$SPIN" "$@" -a broadcast_ring.pml >spin.log 2>&1 &&
         "$CC" -O2 -DSAFETY -o pan pan.c >cc.log 2>&1 ); then
    line "ring $name" - safety - - "FAIL (spin or gcc failed)"; FAILED=1; return
  fi
  ( cd "$d" && ./pan -m"$DEPTH" -w"$HASHW" >"$out" 2>&1 ) || true
  local errors states secs reason res
  errors="$(sed -n 's/.*errors: \([0-9][0-9]*\).*/\1/p' "$out" | tail -n1)"
  states="$(sed -n 's/^ *\([0-9.e+]*\) states, stored.*/\1/p' "$out" | tail -n1)"
  secs="$(sed -n 's/^pan: elapsed time \([0-9.e+-]*\) seconds.*/\1/p' "$out" | tail -n1)"
  reason="$(sed -n 's/^pan:1: \(.*\) (at depth.*/\1/p' "$out" | head -n1)"
  : "${errors:=-1}"
  if [[ "$expect" == pass && "$errors" == 0 ]]; then res=PASS
  elif [[ "$expect" == fail && "$errors" -gt 0 ]]; then res="CAUGHT ($reason)"
  elif [[ "$expect" == reach && "$errors" -gt 0 && "$reason" == "assertion violated 0" ]]; then res=REACHED
  else res="FAIL (expected $expect, errors=$errors: $reason)"; FAILED=1
  fi
  line "ring $name" - safety "${states:-?}" "${secs:-?}s" "$res"
}
ring_run model-no-timeouts pass
ring_run model-bounded-waits pass -DTIMEOUTS
ring_run MUT_NO_RECHECK fail -DMUT_NO_RECHECK
ring_run MUT_RELAXED_STATE fail -DMUT_RELAXED_STATE -DTIMEOUTS
ring_run probe-writer-waits reach -DPROBE=1

echo "total wall time: $((SECONDS - T0)) s"
if (( FAILED )); then
  echo "check-spec: FAILED" >&2
  exit 1
fi
echo "check-spec: OK (all runs pass, all mutations caught, all probes reached)"

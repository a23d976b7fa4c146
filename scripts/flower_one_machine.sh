#!/usr/bin/env bash
# The README's "Deploying on Flower" recipe, end to end on ONE machine (127.0.0.1): TLS, node authentication,
# a SuperLink and 3 SuperNodes (one per site, each with its own Runtime API port), a securefed run, its result.
# tests/flower/test_first_deployment.py runs this script; the README's commands and this script's are the same.
#
#   scripts/flower_one_machine.sh WORKDIR [--set KEY=VALUE ...] [--node KEY=VALUE ...] [--superexec securefed]
#
#   --set KEY=VALUE     run configuration (securefed flower-app --set), e.g. --set method=umap; default: the
#                       default private job (cells through SecAgg+, the audit gate, t-SNE) with value-bound=16
#   --node KEY=VALUE    one more node-config key for every site, e.g. --node require-dp=true
#   --run-config 'K=V ...'  overrides for this run (flwr run ... --run-config), e.g. 'epsilon=4 clip-norm=64'
#   --demo-records N    at most N records per demo site (default: all 1797 digits over the 3 sites)
#   --superexec securefed   opt-in: each SuperNode runs with --isolation process beside securefed's SuperExec
#                       (python -m securefed.flower.superexec: no interpreter start per message; uses Flower
#                       internals — docs/deploying-on-flower.md)
#
# Everything goes into WORKDIR (made if missing; must be empty or absent): certs/, site-*-auth keys, flwr-home/
# (the operator's Flower configuration: FLWR_HOME, so ~/.flwr is never touched), data/ (3 demo CSVs from the
# digits with a record_id and a label column — put your own sites' files there instead), logs/, app/, run/.
# Needs: securefed[flower] (flower-superlink, flower-supernode, flwr, securefed on PATH), openssl, ssh-keygen.
# Every process it starts is stopped when it exits (also on Ctrl-C or an error). Exit status: 0 when the run
# completed, 1 otherwise (the reason is printed).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
usage() { echo "usage: $0 WORKDIR [--set KEY=VALUE ...] [--node KEY=VALUE ...] [--run-config 'K=V ...'] [--demo-records N] [--superexec flower|securefed]" >&2; exit 2; }
[ $# -ge 1 ] || usage
work=$1; shift
sets=(--set value-bound=16 --set min-sites=3)
node_extra=""
run_config=""
demo_records=0
superexec=flower
while [ $# -gt 0 ]; do
  case $1 in
    --set) [ $# -ge 2 ] || usage; sets+=(--set "$2"); shift 2 ;;
    --node) [ $# -ge 2 ] || usage; node_extra+=" $2"; shift 2 ;;
    --run-config) [ $# -ge 2 ] || usage; run_config=$2; shift 2 ;;
    --superexec) [ $# -ge 2 ] || usage; superexec=$2; shift 2 ;;
    --demo-records) [ $# -ge 2 ] || usage; demo_records=$2; shift 2 ;;
    *) usage ;;
  esac
done
case $superexec in flower|securefed) ;; *) echo "error: --superexec $superexec: use flower or securefed" >&2; exit 2 ;; esac
for tool in flower-superlink flower-supernode flwr securefed openssl ssh-keygen; do
  command -v "$tool" >/dev/null || { echo "error: $tool not found on PATH (pip install 'securefed[flower]'; openssl; openssh-client)" >&2; exit 2; }
done
if [ -e "$work" ] && [ -n "$(ls -A "$work")" ]; then echo "error: $work is not empty" >&2; exit 2; fi
mkdir -p "$work"/logs "$work"/data
work=$(cd "$work" && pwd)
cd "$work"  # every process runs here: relative paths, the sites' warm-worker sockets (.securefed-warm) stay inside
PY=${PYTHON:-python3}
# Flower settings securefed runs with (all documented): the SuperExec polls for tasks every 0.1 s, no telemetry,
# no update check. The operator's `flwr` configuration lives in FLWR_HOME (default ~/.flwr).
export FLWR_SUPEREXEC_TASK_POLL_INTERVAL=0.1 FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1
export FLWR_HOME=$work/flwr-home

pids=()
cleanup() {
  local rc=$?
  for p in "${pids[@]}"; do kill -TERM -- "-$p" 2>/dev/null || true; done
  for _ in $(seq 50); do
    local alive=0
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ $alive -eq 0 ] && break
    sleep 0.1
  done
  for p in "${pids[@]}"; do kill -KILL -- "-$p" 2>/dev/null || true; done
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM
start() {  # start NAME CMD...: a long-running process in its own session, output in logs/NAME.log
  local name=$1; shift
  setsid "$@" >"$work/logs/$name.log" 2>&1 &
  pids+=($!)
  echo "started $name (pid $!): $*"
}
say() { echo "== $(date +%H:%M:%S) $*"; }
free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
wait_port() {  # wait_port PORT PID: until PORT accepts connections (fails when PID exits first)
  until "$PY" -c "import socket,sys; s=socket.socket(); sys.exit(s.connect_ex(('127.0.0.1', $1)))" 2>/dev/null; do
    kill -0 "$2" 2>/dev/null || { echo "error: the process $2 exited; see $work/logs" >&2; exit 1; }
    sleep 0.2
  done
}

say "0. demo data: 3 sites (digits split by label), each a CSV with a record_id and a label column"
"$PY" - "$work/data" "$demo_records" <<'EOF'
import csv, sys
from securefed.data import load_dataset, partition
ds = load_dataset("digits")
for s, idx in zip("abc", partition(ds.X, ds.y, 3, "label", random_state=0)):
    idx = idx[: int(sys.argv[2])] if int(sys.argv[2]) > 0 else idx
    with open(f"{sys.argv[1]}/site-{s}.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["record_id", "diagnosis"] + [f"f{j}" for j in range(ds.X.shape[1])])
        for i in idx:
            w.writerow([f"{s.upper()}-{i:05d}", int(ds.y[i])] + [repr(float(v)) for v in ds.X[i]])
EOF

say "1. certificates (a throw-away CA; the SuperLink's certificate for 127.0.0.1)"
bash "$here/make_certs.sh" "$work/certs" localhost 127.0.0.1

say "2. the operator's connection to the SuperLink (needed to register the sites and to launch the run)"
link_port=$(free_port)
mkdir -p "$FLWR_HOME"
cat >"$FLWR_HOME/config.toml" <<EOF
[superlink]
default = "securefed"

[superlink.securefed]
address = "127.0.0.1:$link_port"
root-certificates = "$work/certs/ca.crt"
EOF

say "3. the SuperLink (TLS, node authentication; Fleet, Control and Runtime APIs on port $link_port)"
start superlink flower-superlink --ssl-certfile "$work/certs/server.pem" --ssl-keyfile "$work/certs/server.key" \
  --ssl-ca-certfile "$work/certs/ca.crt" --host 127.0.0.1 --port "$link_port" \
  --disable-runtime-dependency-installation --enable-supernode-auth
wait_port "$link_port" "${pids[0]}"

say "4. node authentication: each site's key pair; the operator registers the public halves"
for s in a b c; do
  ssh-keygen -t ecdsa -b 384 -N "" -q -f "$work/site-$s-auth"
  flwr supernode register "site-$s-auth.pub" securefed
done

say "5. one SuperNode per site, each with its own Runtime API port (--port)"
isolation=()
[ "$superexec" = securefed ] && isolation=(--isolation process)
for s in a b c; do
  port=$(free_port)
  cfg="data-path=\"$work/data/site-$s.csv\" site-name=\"hospital-$s\" id-column=\"record_id\" label-column=\"diagnosis\"$node_extra"
  start "supernode-$s" flower-supernode --superlink "127.0.0.1:$link_port" --root-certificates "$work/certs/ca.crt" \
    --port "$port" "${isolation[@]}" --node-config "$cfg" --auth-supernode-private-key "$work/site-$s-auth"
  if [ "$superexec" = securefed ]; then
    node_pid=${pids[-1]}
    wait_port "$port" "$node_pid"
    start "superexec-$s" "$PY" -m securefed.flower.superexec --runtime-api-address "127.0.0.1:$port" --insecure \
      --parent-pid "$node_pid"
  fi
done

say "6. the run"
securefed flower-app "$work/app" "${sets[@]}" --set out-dir="$work/run"
if [ -n "$run_config" ]; then
  flwr run "$work/app" securefed --run-config "$run_config"
else
  flwr run "$work/app" securefed
fi
# The ServerApp always writes run/result.json: every wait in a run has its deadline (wait-sites, request-timeout).
# This loop only stops early when a process of the deployment dies.
until [ -f "$work/run/result.json" ]; do
  for p in "${pids[@]}"; do
    kill -0 "$p" 2>/dev/null || { echo "error: process $p of the deployment exited; see $work/logs" >&2; exit 1; }
  done
  sleep 1
done
"$PY" - "$work/run" <<'EOF'
import json, os, sys
doc = json.load(open(os.path.join(sys.argv[1], "result.json")))
print(json.dumps({k: doc.get(k) for k in ("status", "sites", "survivors", "round_trips", "round_trips_per_stage",
                                           "seconds", "error_type", "reason")}, indent=1))
if doc.get("status") != "completed":
    sys.exit(1)
print("outputs:", ", ".join(sorted(os.listdir(sys.argv[1]))))
EOF

#!/usr/bin/env bash
# Instructions per command, counted by callgrind inside redis-server: repeatable figures that
# other load on the machine does not disturb (unlike the timings of bench/run.py).
#
#   bash bench/callgrind.sh            # the default commands, 20000 calls each
#   N=5000 bash bench/callgrind.sh     # fewer calls
#   MODULE=/path/to/libshard.so bash bench/callgrind.sh   # another build of the module
#
# Each command is sent by one redis-benchmark client pipelining 100 requests; the figure is
# everything redis-server executed in that time (reading, parsing, the command, the reply)
# divided by the number of calls. Profiles stay in bench/tmp/callgrind/ for callgrind_annotate.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-20000}
MODULE=${MODULE:-$PWD/target/release/libshard.so}
OUT=$PWD/bench/tmp/callgrind
mkdir -p "$OUT"
rm -f "$OUT"/callgrind.out*
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')

valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$OUT/callgrind.out" \
  redis-server --port "$PORT" --bind 127.0.0.1 --save "" --appendonly no --dir "$OUT" \
  --loadmodule "$MODULE" node-id 1 >"$OUT/valgrind.log" 2>&1 &
VG=$!
trap 'redis-cli -p "$PORT" shutdown nosave >/dev/null 2>&1 || kill "$VG" 2>/dev/null; wait "$VG" 2>/dev/null || true' EXIT
for _ in $(seq 100); do redis-cli -p "$PORT" ping >/dev/null 2>&1 && break; sleep 0.2; done

cli() { redis-cli -p "$PORT" "$@" >/dev/null; }
cli SET node_id 1
cli SET user:1000 xxxxxxxxxxxxxxxx
SHA=$(redis-cli -p "$PORT" SCRIPT LOAD "$(sed -n '/^LUA_SNOWFLAKE = """\\$/,/^"""$/p' bench/run.py | sed '1d;$d')")
ring() { cli SHARD.RING SET "$1" $(for i in $(seq 0 999); do echo "node$i 10.0.$((i / 250)).$((i % 250 + 1)):6379 1"; done); }
ring ketama

callgrind_control -i on "$VG" >/dev/null 2>&1
measure() { # name calls command...
  local name=$1 calls=$2; shift 2
  redis-benchmark -p "$PORT" -c 1 -P 100 -n 1000 -q "$@" >/dev/null # warm up
  callgrind_control -z "$VG" >/dev/null 2>&1
  redis-benchmark -p "$PORT" -c 1 -P 100 -n "$calls" -q "$@" >/dev/null
  callgrind_control -d "${name//[^A-Za-z0-9]/_}" "$VG" >/dev/null 2>&1
  local file total
  file=$(ls -t "$OUT"/callgrind.out.* | head -1)
  total=$(callgrind_annotate "$file" | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}')
  printf '%-34s %10d instructions per call\n' "$name" $((total / calls))
}
measure "INCR counter" "$N" INCR counter
measure "GET user:1000" "$N" GET user:1000
measure "SHARD.GENKEY" "$N" SHARD.GENKEY
measure "EVALSHA snowflake 0" "$N" EVALSHA "$SHA" 0
measure "SHARD.WHEREIS (ketama 1000)" "$N" SHARD.WHEREIS user:1000
ring slots
measure "SHARD.WHEREIS (slots 1000)" "$N" SHARD.WHEREIS user:1000
measure "SHARD.GENKEY COUNT 1000" $((N / 100)) SHARD.GENKEY COUNT 1000
echo "profiles: $OUT (callgrind_annotate --inclusive=yes FILE)"

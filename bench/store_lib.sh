# store_lib.sh — sourced by the store benchmarks (store_bench.sh, store_ab.sh,
# side_by_side.sh): the load generator, a free port, waiting for listeners.
#
#   build_store_load TREE OUT   compile TREE/bench/store_load.c against
#                               TREE/build/lib/libcollie.a into OUT
#   free_port                   print a TCP port free on 127.0.0.1 now
#   wait_listening PORT...      until every port accepts (bounded: 10 s);
#                               returns 1 if one never does
build_store_load() {
  cc -std=c11 -D_GNU_SOURCE -O2 -I "$1/include" -I "$1" "$1/bench/store_load.c" \
    "$1/build/lib/libcollie.a" -levent -lcrypto -pthread -o "$2"
}
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
wait_listening() {
  local _ p ok
  for _ in $(seq 1 100); do
    ok=1
    for p in "$@"; do (exec 3<>/dev/tcp/127.0.0.1/"$p") 2>/dev/null || { ok=0; break; }; done
    [ "$ok" -eq 1 ] && return 0
    sleep 0.1
  done
  return 1
}

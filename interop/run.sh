#!/usr/bin/env bash
# make interop: RocketMQ 4.9.7's Java client against idemp's broker. Needs $REALRMQ_HOME
# (a 4.9.7 build: lib/*.jar); our Java programs in interop/java are compiled at run time
# into .cache/interop (never committed). Ports are picked free; the broker is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${REALRMQ_HOME:-}" ] || [ ! -d "$REALRMQ_HOME/lib" ]; then
    echo "make interop: REALRMQ_HOME is not set to a RocketMQ 4.9.7 build (need \$REALRMQ_HOME/lib); nothing run" >&2
    exit 2
fi
CLS=.cache/interop/classes
mkdir -p "$CLS"
javac -nowarn -cp "$REALRMQ_HOME/lib/*" -d "$CLS" interop/java/*.java
free_port() { .venv/bin/python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# the broker's port p, with p - 2 free as well (the VIP channel, RocketMQ's fast port)
free_broker_port() { .venv/bin/python -c '
import socket
for _ in range(100):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; t = socket.socket()
    try:
        t.bind(("127.0.0.1", p - 2))
    except OSError:
        continue
    finally:
        t.close(); s.close()
    print(p); break
'; }
NS_PORT=$(free_port); BR_PORT=$(free_broker_port)
WORK=$(mktemp -d)
.venv/bin/idemp broker -n "127.0.0.1:$NS_PORT" --listen-port "$BR_PORT" --store "$WORK/store" \
    --grpc-port 0 -p autoCreateTopicEnable=true \
    -p transactionCheckInterval=3000 -p transactionTimeOut=2000 -p enablePropertyFilter=true \
    > "$WORK/broker.log" 2>&1 &
BROKER=$!
HOLD=
ACL_BROKER=
CLUSTER=
# (errexit holds in the trap: a JVM stopped by SIGTERM waits as 143)
trap 'kill $HOLD $BROKER $ACL_BROKER $CLUSTER 2>/dev/null; wait $BROKER $ACL_BROKER $CLUSTER 2>/dev/null || true; rm -rf "$WORK"' EXIT
for _ in $(seq 100); do grep -q "idemp broker ready" "$WORK/broker.log" && break; sleep 0.2; done
grep -q "idemp broker ready" "$WORK/broker.log" || { cat "$WORK/broker.log"; exit 1; }
# idemp.bin: the Java features' "mixed" runs idemp's consumer beside a Java one in one group
JAVA_RUN=(java -Duser.home="$WORK" -Didemp.bin="$PWD/.venv/bin/idemp" -cp "$REALRMQ_HOME/lib/*:$CLS")
rc=0
for mode in concurrent orderly; do
    out=$("${JAVA_RUN[@]}" PushCount "127.0.0.1:$NS_PORT" "TopicInterop_$mode" "GInterop_$mode" 100 "$mode" 120 2>/dev/null | grep '^mode=') || rc=1
    echo "idemp broker: $out"
done
out=$("${JAVA_RUN[@]}" ProduceAll "127.0.0.1:$NS_PORT" TopicInteropProduce 20 2>/dev/null | grep '^sync=') || rc=1
echo "idemp broker: $out"
INTEROP_HOME="$WORK" .venv/bin/python interop/mqadmin_cases.py "127.0.0.1:$NS_PORT" "127.0.0.1:$BR_PORT" | sed 's/^/idemp broker: /' || rc=1
# A producer and a consumer kept online (Hold, until its standard input closes) for the
# commands about live clients.
mkfifo "$WORK/hold.in"
"${JAVA_RUN[@]}" Hold "127.0.0.1:$NS_PORT" THold GHold PGHold 3 < "$WORK/hold.in" > "$WORK/hold.out" 2>&1 &
HOLD=$!
exec 7> "$WORK/hold.in"
for _ in $(seq 300); do grep -q "^HOLD" "$WORK/hold.out" && break; sleep 0.2; done
if grep -q "^HOLD ready" "$WORK/hold.out"; then
    INTEROP_HOME="$WORK" .venv/bin/python interop/mqadmin_cases.py "127.0.0.1:$NS_PORT" "127.0.0.1:$BR_PORT" --live | sed 's/^/idemp broker: live clients: /' || rc=1
else
    echo "idemp broker: Hold did not get its clients online:"; cat "$WORK/hold.out"; rc=1
fi
exec 7>&-
wait $HOLD || rc=1
HOLD=
# The Java client's other features, and SQL92 subscriptions, each outcome as seen against
# RocketMQ 4.9.7 with the same settings (transaction checks, enablePropertyFilter) in
# interop/features.expected and interop/sqlfilter.expected.
# compare NAME EXPECTED OUT [REFERENCE]: the outcomes against idemp's broker beside RocketMQ's
compare() {
    local ref=${4:-RocketMQ 4.9.7}
    if diff "$2" "$3" > "$3.diff"; then
        echo "idemp broker: $1: $(wc -l < "$3")/$(wc -l < "$2") as on $ref"
    else
        echo "idemp broker: $1 differ from $ref (< RocketMQ, > idemp):"
        cat "$3.diff"
        rc=1
    fi
}
"${JAVA_RUN[@]}" Features "127.0.0.1:$NS_PORT" x 2>/dev/null | sed -n 's/^FEAT //p' > "$WORK/features.out" || true
compare "Java client features" interop/features.expected "$WORK/features.out"
INTEROP_HOME="$WORK" .venv/bin/python interop/mqadmin_cases.py "127.0.0.1:$NS_PORT" "127.0.0.1:$BR_PORT" --after-features | sed 's/^/idemp broker: /' || rc=1
"${JAVA_RUN[@]}" SqlFilter "127.0.0.1:$NS_PORT" x 2>/dev/null | grep '^SQL' > "$WORK/sql.out" || true
compare "SQL92 subscriptions" interop/sqlfilter.expected "$WORK/sql.out"
# RocketMQ's 5.x Java client (rocketmq-client-java 5.0.8) at the broker's gRPC port, when
# ROCKETMQ5_JAVA_CLIENT names a build of it (interop/java5/build-client.sh): each outcome as
# RocketMQ 5.3.3's proxy gave it, in interop/features5.expected.
if [ -n "${ROCKETMQ5_JAVA_CLIENT:-}" ] && [ -f "$ROCKETMQ5_JAVA_CLIENT/classpath.txt" ]; then
    GRPC=$(sed -n 's/.*idemp broker ready.* grpc=\([^ ]*\).*/\1/p' "$WORK/broker.log")
    for t in TF5_normal:NORMAL TF5_fifo:FIFO TF5_delay:DELAY TF5_tx:TRANSACTION TF5_push:NORMAL TF5_pfifo:FIFO; do
        .venv/bin/idemp admin update-topic --broker "127.0.0.1:$BR_PORT" --topic "${t%%:*}x" --type "${t#*:}" --queues 4 > /dev/null || rc=1
    done
    for g in GF5_fifox GF5_pfifox; do
        .venv/bin/idemp admin update-sub-group --broker "127.0.0.1:$BR_PORT" --group "$g" --fifo > /dev/null || rc=1
    done
    CP5="$(cat "$ROCKETMQ5_JAVA_CLIENT/classpath.txt")"
    mkdir -p .cache/interop/classes5
    javac -nowarn -cp "$CP5" -d .cache/interop/classes5 interop/java5/Features5.java
    java -Duser.home="$WORK" -Drocketmq.log.root="$WORK/logs5" -cp "$CP5:.cache/interop/classes5" \
        Features5 "$GRPC" x 2>/dev/null | sed -n 's/^FEAT //p' > "$WORK/features5.out" || true
    compare "5.x Java client features" interop/features5.expected "$WORK/features5.out" "RocketMQ 5.3.3"
else
    echo "idemp broker: ROCKETMQ5_JAVA_CLIENT is not set to a build of the 5.x Java client (interop/java5/build-client.sh): its features not run"
fi
# mqadmin's ACL commands against a broker with ACL on, signed as RocketMQ's tools sign:
# with the account in conf/tools.yml under rocketmq.home.dir (opsadmin, an admin; appuser1,
# not, for a refusal); the same plain_acl.yml gave the same answers on RocketMQ 4.9.7.
ACL_NS=$(free_port); ACL_BR=$(free_broker_port)
mkdir -p "$WORK/acl"
cat > "$WORK/acl/plain_acl.yml" <<'YML'
globalWhiteRemoteAddresses:
  - 10.10.103.*
accounts:
  - accessKey: opsadmin
    secretKey: ops12345678
    admin: true
  - accessKey: appuser1
    secretKey: app12345678
    admin: false
    defaultTopicPerm: PUB|SUB
    defaultGroupPerm: SUB
YML
for who in opsadmin:ops12345678 appuser1:app12345678; do
    mkdir -p "$WORK/mqadmin-${who%%:*}/conf"
    ln -s "$REALRMQ_HOME/conf/logback_tools.xml" "$WORK/mqadmin-${who%%:*}/conf/"
    printf 'accessKey: %s\nsecretKey: %s\n' "${who%%:*}" "${who#*:}" > "$WORK/mqadmin-${who%%:*}/conf/tools.yml"
done
.venv/bin/idemp broker -n "127.0.0.1:$ACL_NS" --listen-port "$ACL_BR" --store "$WORK/aclstore" \
    --grpc-port -1 -p autoCreateTopicEnable=true -p aclEnable=true \
    -p aclPlainFile="$WORK/acl/plain_acl.yml" > "$WORK/aclbroker.log" 2>&1 &
ACL_BROKER=$!
for _ in $(seq 100); do grep -q "idemp broker ready" "$WORK/aclbroker.log" && break; sleep 0.2; done
if grep -q "idemp broker ready" "$WORK/aclbroker.log"; then
    MQADMIN_HOME="$WORK/mqadmin-opsadmin" MQADMIN_APP_HOME="$WORK/mqadmin-appuser1" INTEROP_HOME="$WORK" \
        .venv/bin/python interop/mqadmin_cases.py "127.0.0.1:$ACL_NS" "127.0.0.1:$ACL_BR" --acl \
        | sed 's/^/idemp broker with ACL: /' || rc=1
else
    cat "$WORK/aclbroker.log"; rc=1
fi
# Several brokers: a RocketMQ 4.9.7 broker and an idemp broker (--no-namesrv) registered
# with idemp namesrv; mqadmin lists both, creates a topic on both, and the Java push
# consumer reads every message of it once across the two.
if [ -f "$REALRMQ_HOME/bin/env.sh" ]; then
    CL_NS=$(free_port); CL_IDEMP=$(free_broker_port); CL_REAL=$(free_broker_port)
    mkdir -p "$WORK/cluster"
    .venv/bin/idemp namesrv --listen-port "$CL_NS" --kv-config "$WORK/cluster/kvConfig.json" \
        > "$WORK/cluster/namesrv.log" 2>&1 &
    CLUSTER="$!"
    for _ in $(seq 100); do grep -q "idemp namesrv ready" "$WORK/cluster/namesrv.log" && break; sleep 0.2; done
    .venv/bin/idemp broker --no-namesrv -n "127.0.0.1:$CL_NS" --listen-port "$CL_IDEMP" \
        --broker-name broker-i --store "$WORK/cluster/idemp" --grpc-port -1 > "$WORK/cluster/idemp.log" 2>&1 &
    CLUSTER="$CLUSTER $!"
    printf '%s\n' brokerClusterName=DefaultCluster brokerName=broker-r brokerId=0 \
        "listenPort=$CL_REAL" "namesrvAddr=127.0.0.1:$CL_NS" brokerIP1=127.0.0.1 \
        "storePathRootDir=$WORK/cluster/real" "storePathCommitLog=$WORK/cluster/real/commitlog" \
        > "$WORK/cluster/real.conf"
    (
        # shellcheck disable=SC1091
        . "$REALRMQ_HOME/bin/env.sh"
        # shellcheck disable=SC2086
        exec "$JAVA" $COMMON_OPTS -Duser.home="$WORK/cluster" -cp "$CP" \
            org.apache.rocketmq.broker.BrokerStartup -c "$WORK/cluster/real.conf"
    ) > "$WORK/cluster/real.log" 2>&1 &
    CLUSTER="$CLUSTER $!"
    # mqadmin as bin/env.sh of the 4.9.7 build launches it (JDK 17's opens, conf/ on the path)
    MQADMIN=(bash -c '. "$REALRMQ_HOME/bin/env.sh" && exec "$JAVA" $COMMON_OPTS -Duser.home="$0" -cp "$CP" org.apache.rocketmq.tools.command.MQAdminStartup "$@"' "$WORK")
    brokers=
    for _ in $(seq 40); do
        brokers=$("${MQADMIN[@]}" clusterList -n "127.0.0.1:$CL_NS" 2>/dev/null | awk '$2 ~ /^broker-/ {print $2}' | sort | tr '\n' ' ') || true
        [ "$brokers" = "broker-i broker-r " ] && break
        sleep 1
    done
    echo "several brokers: clusterList: $brokers"
    [ "$brokers" = "broker-i broker-r " ] || rc=1
    "${MQADMIN[@]}" updateTopic -n "127.0.0.1:$CL_NS" -c DefaultCluster -t TopicCluster -r 2 -w 2 > /dev/null 2>&1 || rc=1
    out=$("${JAVA_RUN[@]}" PushCount "127.0.0.1:$CL_NS" TopicCluster GCluster 100 concurrent 120 2>/dev/null | grep '^mode=') || rc=1
    echo "several brokers: $out"
    queues=$("${MQADMIN[@]}" topicStatus -n "127.0.0.1:$CL_NS" -t TopicCluster 2>/dev/null | awk '$1 ~ /^broker-/ {print $1}' | sort | uniq -c | awk '{print $2 "=" $1}' | tr '\n' ' ') || true
    echo "several brokers: topicStatus queues: $queues"
    [ "$queues" = "broker-i=2 broker-r=2 " ] || rc=1
else
    echo "several brokers: $REALRMQ_HOME/bin/env.sh missing (a realrmq build has it); not run"
    rc=1
fi
exit $rc

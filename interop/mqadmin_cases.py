"""mqadmin 4.9.7 against a broker: each case is a subcommand and what its output must hold.

Run by ``make interop`` (interop/run.sh) as ``python interop/mqadmin_cases.py NAMESRV
BROKER`` with REALRMQ_HOME set, with ``--live`` while interop/java/Hold.java keeps clients
online, with ``--after-features`` for the cases that need what the Java client's features
left, and with ``--acl`` against a broker with ACL on. {ns} is the nameserver address.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass


@dataclass(frozen=True)
class Case:
    args: tuple[str, ...]
    expect: tuple[str, ...]  # every one of these must appear in stdout
    # a regex with named groups read from the output: later cases use them as {name}
    # (message ids and offset ids are made by the broker, so no list can spell them)
    capture: str = ""
    # > 0: a command that never ends by itself (clusterRT loops until stopped) is
    # stopped after this many seconds and what it printed by then is checked
    stop_after: float = 0.0


def _c(line: str, *expect: str, capture: str = "", stop_after: float = 0.0) -> Case:
    return Case(tuple(line.split()), expect, capture, stop_after)


T, G = "TopicInterop_concurrent", "GInterop_concurrent"  # left by PushCount: 100 consumed

# What mqadmin prints for each on RocketMQ 4.9.7 (run side by side, see docs/broker.md);
# every case runs in this order, after the Java programs of interop/run.sh.
CASES: list[Case] = [
    _c(
        "updateTopic -n {ns} -c DefaultCluster -t TopicAdmin1 -r 4 -w 4",
        "create topic to",
        "success",
    ),
    _c("topicList -n {ns}", "TopicAdmin1", "BenchmarkTest", "DefaultCluster_REPLY_TOPIC"),
    _c("topicRoute -n {ns} -t TopicAdmin1", '"readQueueNums":4'),
    # messages: send, then find them by key, by queue offset, by queue, by pulling
    _c(
        "sendMessage -n {ns} -t TopicAdmin1 -p hello-admin -k KADM -c tagA -b broker-a -i 0",
        "broker-a                          0     SEND_OK",
    ),
    _c("queryMsgByKey -n {ns} -t TopicAdmin1 -k KADM", "#Message ID"),
    _c(
        "queryMsgByKey -n {ns} -t TopicAdmin1 -k NoSuchKey",
        "CODE: 208  DESC: query message by key finished, but no message.",
    ),
    _c(
        "queryMsgByOffset -n {ns} -t TopicAdmin1 -b broker-a -i 0 -o 0",
        "Keys:                [KADM]",
        "KEYS=KADM, UNIQ_KEY=",
    ),
    _c("printMsg -n {ns} -t TopicAdmin1 -s tagA", "BODY: hello-admin"),
    _c(
        "printMsgByQueue -n {ns} -t TopicAdmin1 -a broker-a -i 0 -p true -d true",
        "BODY: hello-admin",
    ),
    _c(
        "consumeMessage -n {ns} -t TopicAdmin1 -b broker-a -i 0 -o 0 -c 1",
        "Consume ok",
        "BODY: hello-admin",
    ),
    _c(
        "consumeMessage -n {ns} -t TopicAdmin1 -b broker-a -i 0 -o 5",
        "queueId=0] no matched msg, offset=5",
    ),
    # the same message by its two ids: the producer's (UNIQ_KEY) and the broker's offset id
    _c(
        "queryMsgByOffset -n {ns} -t TopicAdmin1 -b broker-a -i 0 -o 0",
        "Keys:                [KADM]",
        capture=r"OffsetID:\s+(?P<offset_id>[0-9A-F]{32})\s.*UNIQ_KEY=(?P<uniq>[0-9A-F]+)",
    ),
    _c(
        "queryMsgByUniqueKey -n {ns} -t TopicAdmin1 -i {uniq}",
        "Topic:               TopicAdmin1",
        "Keys:                [KADM]",
        "Queue Offset:        0",
        "Properties:          {KEYS=KADM, UNIQ_KEY={uniq}, CLUSTER=DefaultCluster, TAGS=tagA}",
    ),
    _c(
        "queryMsgById -n {ns} -i {offset_id}",
        "OffsetID:            {offset_id}",
        "Keys:                [KADM]",
        "Reconsume Times:     0",
    ),
    # an offset id past the end of the commit log: the broker's error, as RocketMQ words it
    _c(
        "queryMsgById -n {ns} -i {offset_id_past}",
        "CODE: 1  DESC: can not find message by the offset, 1048576",
    ),
    _c("checkMsgSendRT -n {ns} -t TopicAdmin1 -a 3 -s 64", "Avg RT:"),
    _c("sendMsgStatus -n {ns} -b broker-a -s 64 -c 2", "SendResult [sendStatus=SEND_OK"),
    _c(
        "allocateMQ -n {ns} -t TopicAdmin1 -i 1.1.1.1,2.2.2.2",
        '"2.2.2.2":[{"brokerName":"broker-a","queueId":0,"topic":"TopicAdmin1"},'
        '{"brokerName":"broker-a","queueId":1,"topic":"TopicAdmin1"}]',
    ),
    _c(
        "updateTopicPerm -n {ns} -t TopicAdmin1 -b {broker} -p 4",
        "update topic perm from 6 to 4 in {broker} success.",
        "perm=R--",
    ),
    _c(
        "updateTopicPerm -n {ns} -t TopicAdmin1 -b {broker} -p 6",
        "update topic perm from 4 to 6 in {broker} success.",
    ),
    _c("topicClusterList -n {ns} -t TopicAdmin1", "DefaultCluster"),
    _c(f"topicStatus -n {{ns}} -t {T}", "#Min Offset", "broker-a"),
    _c(f"consumerProgress -n {{ns}} -g {G}", "Diff Total: 0"),
    _c("consumerProgress -n {ns}", G, "OFFLINE"),
    _c(
        f"consumerConnection -n {{ns}} -g {G}",
        f"CODE: 206  DESC: the consumer group[{G}] not online",
    ),
    _c(
        f"producerConnection -n {{ns}} -g NoSuchProducer -t {T}",
        "CODE: 1  DESC: the producer group[NoSuchProducer] not exist",
    ),
    _c("brokerConsumeStats -n {ns} -b {broker}", G, "Diff Total: 0"),
    _c("clusterList -n {ns}", "DefaultCluster", "V4_9_7"),
    _c("clusterList -n {ns} -m", "#InTotalToday", "broker-a"),
    _c("brokerStatus -n {ns} -b {broker}", "brokerVersionDesc", "V4_9_7", "msgPutTotalTodayNow"),
    _c("statsAll -n {ns}", T, G),
    _c("topicList -n {ns} -c", T, G),
    _c("getBrokerConfig -n {ns} -b {broker}", "brokerName", "broker-a"),
    # one of the groups RocketMQ creates at start (mqadmin's own pulls use it)
    _c(
        "getConsumerConfig -n {ns} -g TOOLS_CONSUMER",
        "=============================DefaultCluster:broker-a=============================",
        "groupName                               =  TOOLS_CONSUMER",
        "retryMaxTimes                           =  16",
    ),
    _c(
        "updateBrokerConfig -n {ns} -b {broker} -k maxMessageSize -v 4194304",
        "update broker config success",
    ),
    _c(
        "clusterRT -n {ns} -a 2 -s 64 -p 0 -i 1",
        "#Cluster Name             #Broker Name              #RT   #successCount  #failCount",
        "DefaultCluster            broker-a",
        stop_after=8.0,
    ),
    _c("getNamesrvConfig -n {ns}", "listenPort"),
    _c(
        "updateNamesrvConfig -n {ns} -k serverWorkerThreads -v 16",
        "update name server config success!",
    ),
    _c("getNamesrvConfig -n {ns}", "serverWorkerThreads                               =  16"),
    _c("updateNamesrvConfig -n {ns} -k configStorePath -v /x", "CODE: 16  DESC: Can not update"),
    _c(
        "updateKvConfig -n {ns} -s NS1 -k K1 -v V1",
        "create or update kv config to namespace success.",
    ),
    _c("deleteKvConfig -n {ns} -s NS1 -k K1", "delete kv config from namespace success."),
    _c(
        "updateOrderConf -n {ns} -t TopicAdmin1 -m put -v broker-a:4",
        "update orderConf success. topic=[TopicAdmin1], orderConf=[broker-a:4]",
    ),
    _c(
        "updateOrderConf -n {ns} -t TopicAdmin1 -m get",
        "get orderConf success. topic=[TopicAdmin1], orderConf=[broker-a:4]",
    ),
    _c(
        "updateTopic -n {ns} -c DefaultCluster -t TopicOrd -r 2 -w 2 -o true",
        "set cluster orderConf. isOrder=true, orderConf=[broker-a:2]",
    ),
    _c("brokerConsumeStats -n {ns} -b {broker} -o true", "Diff Total: 0"),
    _c(
        "wipeWritePerm -n {ns} -b broker-a",
        "wipe write perm of broker[broker-a] in name server",
        "OK",
    ),
    _c("topicRoute -n {ns} -t TopicAdmin1", '"perm":4'),
    _c(
        "addWritePerm -n {ns} -b broker-a",
        "add write perm of broker[broker-a] in name server",
        "OK",
    ),
    _c("topicRoute -n {ns} -t TopicAdmin1", '"perm":6'),
    _c(
        "deleteTopic -n {ns} -c DefaultCluster -t TopicOrd",
        "delete topic [TopicOrd] from cluster [DefaultCluster] success.",
        "delete topic [TopicOrd] from NameServer success.",
    ),
    _c(
        "updateSubGroup -n {ns} -c DefaultCluster -g GDel",
        "create subscription group to",
        "success",
    ),
    _c(
        "deleteSubGroup -n {ns} -c DefaultCluster -g GDel",
        "delete subscription group [GDel] from broker",
        "success.",
    ),
    _c(
        f"cloneGroupOffset -n {{ns}} -s {G} -d GClone -t {T} -o true",
        f"clone group offset success. srcGroup[{G}], destGroup=[GClone], topic[{T}]",
    ),
    # as on RocketMQ: the clone has offsets but no retry topic, so no progress to show
    _c(
        "consumerProgress -n {ns} -g GClone",
        "No topic route info in name server for the topic: %RETRY%GClone",
    ),
    _c(
        f"resetOffsetByTime -n {{ns}} -g {G} -t {T} -s 0",
        "rollback consumer offset by specified consumerGroup[" + G + "]",
        "#rollbackOffset",
    ),
    _c(f"consumerProgress -n {{ns}} -g {G}", "Diff Total: 100"),
    _c(f"skipAccumulatedMessage -n {{ns}} -g {G} -t {T}", "#rollbackOffset"),
    _c(f"consumerProgress -n {{ns}} -g {G}", "Diff Total: 0"),
    _c(f"queryCq -n {{ns}} -t {T} -q 0 -i 0 -c 2", "ConsumeQueueData{physicOffset="),
    _c("cleanExpiredCQ -n {ns} -c DefaultCluster", "success"),
    _c("cleanUnusedTopic -n {ns} -c DefaultCluster", "success"),
    _c("deleteExpiredCommitLog -n {ns} -c DefaultCluster", "success"),
    _c(
        "exportMetadata -n {ns} -c DefaultCluster -f {home}/export",
        "export {home}/export/metadata.json success",
    ),
    _c(
        "exportMetrics -n {ns} -c DefaultCluster -f {home}/export",
        "export {home}/export/metrics.json success",
    ),
    # reads brokerRole, fileReservedTime, useTLS, ... from getBrokerConfig (an NPE if absent)
    _c(
        "exportConfigs -n {ns} -c DefaultCluster -f {home}/export",
        "export {home}/export/configs.json success",
    ),
]


# Run after interop/java/Features.java (run id "x"), whose "trace" and "subtrace" features
# leave a message traced by its producer and one traced by its consumer.
# While interop/java/Hold.java keeps a producer (PGHold) and a push consumer (GHold of
# THold, 3 messages consumed) online: the commands that ask about live clients, the
# broker passing some of them on to the client (consumerStatus, resetOffsetByTime).
LIVE: list[Case] = [
    _c(
        "producer -n {ns} -b {broker}",
        "producer group (PGHold) instance : clientId=",
        "language=JAVA, version=407, lastUpdateTimestamp=",
        "producer group (CLIENT_INNER_PRODUCER) instance : clientId=",
    ),
    _c("producerConnection -n {ns} -g PGHold -t THold", "0001  ", "JAVA     V4_9_7"),
    _c(
        "consumerConnection -n {ns} -g GHold",
        "#ClientId                            #ClientAddr            #Language  #Version",
        "JAVA       V4_9_7",
        "THold                *",
        "%RETRY%GHold         *",
        "ConsumeType: CONSUME_PASSIVELY",
        "MessageModel: CLUSTERING",
        "ConsumeFromWhere: CONSUME_FROM_FIRST_OFFSET",
    ),
    _c(
        "consumerStatus -n {ns} -g GHold",
        "#ConsumerRunningInfoFile",
        "Same subscription in the same group of consumer",
        "Rebalance OK",
        capture=r"\n1\s+(?P<client>\S+)\s+V4_9_7",
    ),
    _c(
        "consumerStatus -n {ns} -g GHold -i {client}",
        "#Consumer Properties#",
        "consumerGroup                           : GHold",
        "PROP_NAMESERVER_ADDR                    : {ns};",
        "002 Topic: THold                                    ClassFilter: false    "
        "SubExpression: *",
        "#Consumer Offset#",
        "#Consumer MQ Detail#",
        "#Consumer RT&TPS#",
    ),
    _c(
        "consumerProgress -n {ns} -g GHold -s true",
        "#Client IP",
        "Diff Total: 0",
    ),
    _c("consumerProgress -n {ns}", "PUSH   CLUSTERING"),
    _c(
        "resetOffsetByTime -n {ns} -g GHold -t THold -s 0",
        "rollback consumer offset by specified group[GHold], topic[THold], force[true], "
        "timestamp(string)[0], timestamp(long)[0]",
        "#brokerName                               #queueId",
    ),
]

AFTER_FEATURES: list[Case] = [
    _c(
        "queryMsgByKey -n {ns} -t TF_tracex -k tkeyx",
        "#Message ID",
        capture=r"\n(?P<pub_id>[0-9A-F]{32,}) ",
    ),
    _c(
        "queryMsgTraceById -n {ns} -i {pub_id} -t RMQ_SYS_TRACE_TOPIC",
        "#Type      #ProducerGroup       #ClientHost          #SendTime            #CostTimes",
        "Pub        PF_tracex            127.0.0.1",
    ),
    _c(
        "queryMsgByKey -n {ns} -t TF_subtracex -k stkeyx",
        "#Message ID",
        capture=r"\n(?P<sub_id>[0-9A-F]{32,}) ",
    ),
    _c(
        "queryMsgTraceById -n {ns} -i {sub_id}",
        "#Type      #ConsumerGroup       #ClientHost          #ConsumerTime        #CostTimes",
        "Sub        CF_stx               127.0.0.1",
    ),
]

# Against a broker with aclEnable=true and the accounts of interop/run.sh (opsadmin, an
# admin; appuser1, not), mqadmin signing with opsadmin's key from the tools.yml under
# $MQADMIN_HOME/conf (appuser1's for the cases run with {app_home}); each the same on
# RocketMQ 4.9.7 with the same plain_acl.yml (2026-11-28), but for the secret a too short
# key's refusal names, which idemp masks.
ACL: list[Case] = [
    _c("updateTopic -n {ns} -c DefaultCluster -t TopicAcl1", "create topic to {broker} success."),
    _c(
        "getAccessConfigSubCommand -n {ns} -c DefaultCluster",
        "globalWhiteRemoteAddresses: [10.10.103.*]",
        "accessKey         : appuser1",
        "secretKey         : app12345678",
        "defaultTopicPerm  : PUB|SUB",
    ),
    _c(
        "updateAclConfig -n {ns} -b {broker} -a newuser1 -s newsecret1 -t TopicAcl1=PUB -g G1=SUB",
        "create or update plain access config to {broker} success.",
    ),
    _c(
        "clusterAclConfigVersion -n {ns} -c DefaultCluster",
        "#AclConfigVersionNum",
        "get cluster's plain access config version success.",
    ),
    _c(
        "updateGlobalWhiteAddr -n {ns} -b {broker} -g 10.10.*.*,192.168.1.*",
        "update global white remote addresses to {broker} success.",
    ),
    _c(
        "getAccessConfigSubCommand -n {ns} -b {broker}",
        "globalWhiteRemoteAddresses: [10.10.*.*, 192.168.1.*]",
        "accessKey         : newuser1",
        "topicPerms        : [TopicAcl1=PUB]",
        "groupPerms        : [G1=SUB]",
    ),
    _c(
        "deleteAccessConfig -n {ns} -b {broker} -a newuser1",
        "delete plain access config account from {broker} success.",
    ),
    _c(
        "deleteAccessConfig -n {ns} -b {broker} -a nosuchuser",
        "CODE: 210  DESC: The accesskey[nosuchuser] corresponding to accessConfig has been "
        "deleted failed.",
    ),
    _c("updateAclConfig -n {ns} -b {broker} -a short -s x", "CODE: 209  DESC: The accessKey=short"),
    _c(
        "-Drocketmq.home.dir={app_home} updateTopic -n {ns} -c DefaultCluster -t TopicAcl2",
        "CODE: 1  DESC: org.apache.rocketmq.acl.common.AclException: Need admin permission for "
        "request code=17, but accessKey=appuser1 is not",
    ),
]


def run_case(launch: str, args: list[str], stop_after: float, cwd: str) -> str:
    # leading -D arguments are the JVM's (rocketmq.home.dir: where conf/tools.yml is)
    defines = [a for a in args if a.startswith("-D")]
    args = [a for a in args if not a.startswith("-D")]
    home = os.environ.get("MQADMIN_HOME")
    if home and not defines:
        defines = [f"-Drocketmq.home.dir={home}"]
    env = {**os.environ, "MQADMIN_DEFINES": " ".join(defines)}
    cmd = ["bash", "-c", launch, "mqadmin", *args]
    if not stop_after:
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=cwd, env=env)
        return run.stdout + run.stderr  # mqadmin prints a failure's cause on stderr
    try:
        subprocess.run(cmd, capture_output=True, text=True, timeout=stop_after, cwd=cwd, env=env)
    except subprocess.TimeoutExpired as stopped:  # the expected end: it had to be stopped
        return _text(stopped.stdout) + _text(stopped.stderr)
    raise RuntimeError(f"mqadmin {args[0]} ended by itself within {stop_after} s")


def _fill(text: str, values: dict[str, str]) -> str:
    """{name} → its value; other braces (JSON, property maps) stay as they are."""
    return re.sub(r"\{(\w+)\}", lambda m: values.get(m[1], m[0]), text)


def _text(out: str | bytes | None) -> str:
    return out.decode() if isinstance(out, bytes) else out or ""


def main(ns: str, broker: str, cases: list[Case]) -> int:
    home = os.environ["REALRMQ_HOME"]
    user_home = os.environ.get("INTEROP_HOME", home)
    # bin/env.sh of the 4.9.7 build sets JAVA, COMMON_OPTS (JDK 17 opens) and CP
    launch = (
        f'. "{home}/bin/env.sh" && exec "$JAVA" $COMMON_OPTS $MQADMIN_DEFINES '
        f'-Duser.home="{user_home}" -cp "$CP" org.apache.rocketmq.tools.command.MQAdminStartup "$@"'
    )
    # {offset_id_past}: the broker's own address with a commit log offset of 1 MiB, which
    # the few messages before it never reach
    host, port = broker.rsplit(":", 1)
    address = "".join(f"{int(b):02X}" for b in host.split(".")) + f"{int(port):08X}"
    values = {"ns": ns, "broker": broker, "home": user_home}
    values["app_home"] = os.environ.get("MQADMIN_APP_HOME", "")
    values["offset_id_past"] = f"{address}{1 << 20:016X}"
    failed = 0
    # consumerStatus without -i writes each client's running info under ./<time>/
    scratch = tempfile.mkdtemp(prefix="mqadmin-")
    for case in cases:
        args = [_fill(a, values) for a in case.args]
        out = run_case(launch, args, case.stop_after, scratch)
        expect = [_fill(e, values) for e in case.expect]
        missing = [e for e in expect if e not in out]
        if case.capture and not missing:
            found = re.search(case.capture, out, re.S)
            if found:
                values.update(found.groupdict())
            else:
                missing.append(f"/{case.capture}/")
        status = "ok" if not missing else f"FAIL missing {missing!r} in:\n{out[-1500:]}"
        failed += bool(missing)
        name = next(a for a in args if not a.startswith("-D"))
        print(f"mqadmin {name}: {status}")
    shutil.rmtree(scratch, ignore_errors=True)
    print(f"mqadmin: {len(cases) - failed}/{len(cases)} cases as expected")
    return 1 if failed else 0


if __name__ == "__main__":
    lists = {"--after-features": AFTER_FEATURES, "--live": LIVE, "--acl": ACL}
    sys.exit(main(sys.argv[1], sys.argv[2], lists[sys.argv[3]] if sys.argv[3:] else CASES))

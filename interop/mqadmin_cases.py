"""mqadmin 4.9.7 against a broker: each case is a subcommand and what its output must hold.

Run by ``make interop`` (interop/run.sh) as ``python interop/mqadmin_cases.py NAMESRV``
with REALRMQ_HOME set. One list, so the mqadmin work (helper B's) can extend it.
{ns} is the nameserver address.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class Case:
    args: tuple[str, ...]
    expect: tuple[str, ...]  # every one of these must appear in stdout


CASES: list[Case] = [
    Case(
        (
            "updateTopic",
            "-n",
            "{ns}",
            "-c",
            "DefaultCluster",
            "-t",
            "TopicAdmin1",
            "-r",
            "4",
            "-w",
            "4",
        ),
        ("create topic to", "success"),
    ),
    Case(("topicList", "-n", "{ns}"), ("TopicAdmin1",)),
    Case(("topicRoute", "-n", "{ns}", "-t", "TopicAdmin1"), ('"readQueueNums":4',)),
]


def main(ns: str) -> int:
    home = os.environ["REALRMQ_HOME"]
    user_home = os.environ.get("INTEROP_HOME", home)
    # bin/env.sh of the 4.9.7 build sets JAVA, COMMON_OPTS (JDK 17 opens) and CP
    launch = (
        f'. "{home}/bin/env.sh" && exec "$JAVA" $COMMON_OPTS -Duser.home="{user_home}" '
        '-cp "$CP" org.apache.rocketmq.tools.command.MQAdminStartup "$@"'
    )
    failed = 0
    for case in CASES:
        args = [a.format(ns=ns) for a in case.args]
        cmd = ["bash", "-c", launch, "mqadmin", *args]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120).stdout
        missing = [e for e in case.expect if e not in out]
        status = "ok" if not missing else f"FAIL missing {missing!r}"
        failed += bool(missing)
        print(f"mqadmin {args[0]}: {status}")
    print(f"mqadmin: {len(CASES) - failed}/{len(CASES)} cases as expected")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

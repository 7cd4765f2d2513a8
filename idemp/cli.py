"""The ``idemp`` command."""

from __future__ import annotations

import argparse
import sys


class _SubcommandParser(argparse.ArgumentParser):
    """Rejects unknown options itself, so the error shows this subcommand's usage.

    Plain argparse hands a subcommand's leftovers back to the top-level parser, which
    then prints ``usage: idemp [-h] ...``: true, but no help to someone who mistyped an
    option of ``idemp reconcile``.
    """

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[no-untyped-def]
        parsed, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed, extras


def build_parser() -> argparse.ArgumentParser:
    from idemp import __version__
    from idemp.broker import main as broker_main
    from idemp.broker import namesrv_main

    parser = argparse.ArgumentParser(prog="idemp", description=__doc__)
    parser.add_argument("--version", action="version", version=f"idemp {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_SubcommandParser)
    broker = sub.add_parser("broker", help="run idemp's minimal RocketMQ broker")
    broker_main.add_arguments(broker)
    namesrv = sub.add_parser("namesrv", help="run a nameserver alone (as mqnamesrv)")
    namesrv_main.add_arguments(namesrv)
    broker_sub = broker.add_subparsers(dest="broker_command")
    export = broker_sub.add_parser("export", help="export a store's message history")
    export.add_argument(
        "--store", required=True, dest="export_store", help="the broker's store directory"
    )
    export.add_argument("--out", required=True, help="file to write (.parquet or .jsonl)")
    export.add_argument(
        "--format",
        choices=["parquet", "jsonl"],
        default=None,
        help="default: from the file extension",
    )
    export.add_argument(
        "--with-body",
        action="store_true",
        help="write bodies (base64 in JSON lines) instead of their SHA-256",
    )
    export.add_argument(
        "--broker-name",
        dest="export_broker",
        help="the store's broker name, on every row (a cluster's stores: one export each)",
    )
    from idemp.tools import consume as consume_tool
    from idemp.tools import produce as produce_tool

    produce_tool.add_arguments(sub.add_parser("produce", help="send test messages"))
    consume_tool.add_arguments(sub.add_parser("consume", help="consume and record messages"))
    from idemp.reconcile import cli as reconcile_cli

    reconcile_cli.add_arguments(
        sub.add_parser("reconcile", help="reconcile dedup records against message history")
    )
    from idemp.tools import history as history_tool

    history = sub.add_parser("history", help="message history of a live cluster")
    history_sub = history.add_subparsers(dest="history_command", required=True)
    history_tool.add_arguments(
        history_sub.add_parser("pull", help="pull topics (and retry/DLQ) into Parquet")
    )
    from idemp.tools import admin as admin_tool

    admin_tool.add_arguments(
        sub.add_parser("admin", help="create topics and groups on a broker (as mqadmin)")
    )
    from idemp.tools import dlq as dlq_tool

    dlq_tool.add_arguments(
        sub.add_parser("dlq", help="list a group's dead letters, or send them back to it")
    )
    from idemp import worker

    worker.add_arguments(
        sub.add_parser("worker", help="run an App's listeners until SIGTERM (MODULE:APP)")
    )
    from idemp.demo.run import add_arguments as demo_arguments

    demo_arguments(sub.add_parser("demo", help="run the demo on embedded defaults"))
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "broker":
        if args.broker_command == "export":
            from idemp.broker.export import run_export

            return run_export(
                args.export_store, args.out, args.format, args.with_body, args.export_broker
            )
        from idemp.broker.main import run

        return run(args)
    if args.command == "namesrv":
        from idemp.broker.namesrv_main import run as run_namesrv

        return run_namesrv(args)
    if args.command == "produce":
        from idemp.tools.produce import run as run_produce

        return run_produce(args)
    if args.command == "consume":
        from idemp.tools.consume import run as run_consume

        return run_consume(args)
    if args.command == "reconcile":
        from idemp.reconcile.cli import run as run_reconcile

        return run_reconcile(args)
    if args.command == "history":
        from idemp.tools.history import run as run_history

        return run_history(args)
    if args.command == "admin":
        from idemp.tools.admin import run as run_admin

        return run_admin(args)
    if args.command == "dlq":
        from idemp.tools.dlq import run as run_dlq

        return run_dlq(args)
    if args.command == "worker":
        from idemp.worker import run as run_worker

        return run_worker(args)
    if args.command == "demo":
        from idemp.demo import run_demo

        return run_demo(args)
    return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

"""Command line: parses arguments, calls one command, turns errors into exit codes.

Exit codes: 0 ok, 1 error, 2 usage (and, for plan --detailed-exitcode,
pending changes).
"""

import argparse
import importlib
import sys

from lbctl.errors import ConfigError, LbctlError


def build_parser():
    parser = argparse.ArgumentParser(
        prog="lbctl", description="Declarative IPVS direct-routing load balancers.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("validate", help="check a cluster file")
    p.add_argument("file")

    for name, text in (("plan", "show what apply would change on this node"),
                       ("apply", "make this node match the cluster file")):
        p = sub.add_parser(name, help=text)
        p.add_argument("file")
        p.add_argument("--node", help="node name (default: found from this host's addresses)")
        p.add_argument("--force", action="store_true",
                       help="delete removed real servers at once instead of draining them")
        p.add_argument("--root", default="/",
                       help="prefix for the files lbctl writes (default /)")
        if name == "plan":
            p.add_argument("--detailed-exitcode", action="store_true",
                           help="exit 0 for no changes, 2 for pending changes")

    p = sub.add_parser("status", help="services, real servers, connection sync, health, VRRP, "
                       "VIPs and ARP settings here")
    p.add_argument("file", nargs="?",
                   help="cluster file, to name this node (default: the clusters applied here)")
    p.add_argument("--node", help="node name (default: found from this host's addresses)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--root", default="/", help="prefix of lbctl's files (default /)")

    p = sub.add_parser("lab", help="the cluster in network namespaces, on this machine")
    lab = p.add_subparsers(dest="lab_command", required=True, metavar="LAB_COMMAND")
    d = lab.add_parser("demo", help="build the lab, apply, send traffic, show the result, tear down")
    d.add_argument("file", nargs="?", help="cluster file (default: the bundled failover-pair example)")
    d.add_argument("--requests", type=int, default=12, help="curl requests to show (default 12)")
    return parser


COMMANDS = {"validate": "validate", "plan": "plan", "apply": "apply", "status": "status",
            "lab": "lab"}


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    module = importlib.import_module(f"lbctl.commands.{COMMANDS[args.command]}")
    try:
        return module.run(args, sys.stdout)
    except ConfigError as exc:
        for diag in exc.diagnostics:
            print(diag.format(), file=sys.stderr)
        return 1
    except LbctlError as exc:
        if args.debug:
            raise
        print(f"lbctl: {exc}", file=sys.stderr)
        return exc.exit_code
    except PermissionError as exc:
        if args.debug:
            raise
        print(f"lbctl: {args.command}: permission denied: {exc.filename or exc}; run as root",
              file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

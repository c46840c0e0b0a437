"""Command line: parses arguments, calls one command, turns errors into exit codes.

Exit codes: 0 ok, 1 error (or problems found by doctor), 2 pending changes
(plan and status --detailed-exitcode), 3 a node runs another version of lbctl
(--expect-version), 4 some nodes did not answer (plan, status and doctor
with --all), 64 usage.
"""

import argparse
import importlib
import os
import sys

from lbctl import __version__
from lbctl.errors import EXIT_USAGE, EXIT_VERSION, ConfigError, LbctlError

EXIT_BROKEN_PIPE = 128 + 13  # as a shell reports a program SIGPIPE ended


class Parser(argparse.ArgumentParser):
    """argparse, with usage errors on their own exit code: 2 means pending changes."""

    def error(self, message):
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _common_flags():
    """Flags every subcommand takes, after its name as well as before it."""
    common = Parser(add_help=False)
    # SUPPRESS: a flag given before the subcommand is not reset by its absence after.
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show tracebacks on errors")
    common.add_argument("--expect-version", metavar="VERSION", default=argparse.SUPPRESS,
                        help="exit 3 unless this is lbctl VERSION (--all passes it to every node)")
    return common


def _remote_flags(p):
    p.add_argument("--all", action="store_true",
                   help="run on every node of the file over SSH, from this machine")
    p.add_argument("--ssh-config", metavar="FILE",
                   help="with --all: an ssh_config(5) file for ssh -F (default: ~/.ssh/config)")


def _add_root(p):
    p.add_argument("--root", metavar="DIR",
                   help="prefix of the files lbctl reads and writes (default $LBCTL_ROOT or /)")


def build_parser():
    common = _common_flags()
    parser = Parser(prog="lbctl", parents=[common],
                    description="Declarative IPVS direct-routing load balancers.")
    parser.add_argument("--version", action="version", version=f"lbctl {__version__}",
                        help="show lbctl's version and exit (exit 3 when --expect-version "
                        "names another)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                parser_class=Parser)

    p = sub.add_parser("validate", parents=[common], help="check a cluster file (- reads stdin)")
    p.add_argument("file", help="the cluster file, or - for standard input")

    for name, text in (("plan", "show what apply would change on this node"),
                       ("apply", "make this node match the cluster file")):
        p = sub.add_parser(name, parents=[common], help=text)
        p.add_argument("file", help="the cluster file, or - for standard input")
        p.add_argument("--node", help="this node's name (default: found from this host's "
                       "addresses); with --all, the nodes to run on: NAME[,NAME...]")
        _remote_flags(p)
        p.add_argument("--remove", action="store_true",
                       help="take away everything lbctl put on the node for this cluster")
        p.add_argument("--force", action="store_true",
                       help="delete removed real servers at once instead of draining them")
        if name == "apply":
            p.add_argument("--keep-leaving", action="store_true",
                           help="add and change only, and leave removals for a later apply "
                           "(what --all does on workers before the balancers)")
            p.add_argument("--yes", action="store_true",
                           help="with --all: change the nodes without asking (on a terminal, "
                           "apply --all shows each node's plan and asks first; without one "
                           "it needs --yes)")
            p.add_argument("--dry-run", action="store_true",
                           help="change nothing: the same as `lbctl plan`")
            # apply --all's own: the plan this node showed before the question.
            p.add_argument("--expect-plan", metavar="FINGERPRINT", help=argparse.SUPPRESS)
        _add_root(p)
        if name == "plan":
            p.add_argument("--detailed-exitcode", action="store_true",
                           help="exit 0 for no changes, 2 for pending changes")
            # For apply --all: the plan's fingerprint on standard error.
            p.add_argument("--fingerprint", action="store_true", help=argparse.SUPPRESS)

    p = sub.add_parser("status", parents=[common],
                       help="services, real servers, connection sync, health, VRRP, "
                       "VIPs and ARP settings here (or, with --all, on every node)")
    p.add_argument("file", nargs="?",
                   help="cluster file, to name this node (default: the clusters applied here)")
    p.add_argument("--node", help="this node's name (default: found from this host's "
                   "addresses); with --all, the nodes to ask: NAME[,NAME...]")
    _remote_flags(p)
    p.add_argument("--json", action="store_true",
                   help="the report as JSON (what --all reads from each node), for scripts")
    p.add_argument("--no-drift", action="store_true",
                   help="with FILE: leave out what apply would change here (faster)")
    p.add_argument("--detailed-exitcode", action="store_true",
                   help="with FILE: exit 2 when apply would change something here (with "
                   "--all: on any node that answered), else 1 (4 with --all) when that "
                   "cannot be known")
    p.add_argument("--connections", action="store_true",
                   help="list the kernel's IPVS connections, named from FILE or the file "
                   "last applied here, then counts by state per service and worker")
    p.add_argument("--watch", action="store_true",
                   help="a live view, redrawn in place: health, weights, drains, connections "
                   "and rates per worker, and the VRRP role (Ctrl-C leaves)")
    p.add_argument("--interval", type=float, default=2.0, metavar="SECONDS",
                   help="with --watch: seconds between frames (default 2)")
    p.add_argument("--service", metavar="NAME", help="with --connections: this service only")
    p.add_argument("--worker", metavar="NAME", help="with --connections: this worker only")
    p.add_argument("--client", metavar="CIDR",
                   help="with --connections: clients in this network only")
    _add_root(p)

    for name, text in (("drain", "take a worker out of rotation: weight 0 on every service "
                         "(or one) until undrain, kept across apply, failover and reboot"),
                       ("undrain", "give a drained worker its weights from the file back")):
        p = sub.add_parser(name, parents=[common], help=text)
        p.add_argument("worker", help="the worker's name in the cluster file")
        p.add_argument("file", nargs="?", help="the cluster file (default: the one last applied "
                       "on this balancer); needed with --all")
        p.add_argument("--service", metavar="NAME", help=f"{name} on this service only")
        p.add_argument("--node", help="this balancer's name (default: found from this host's "
                       "addresses); with --all, the balancers to reach: NAME[,NAME...]")
        _remote_flags(p)
        if name == "drain":
            p.add_argument("--wait", action="store_true",
                           help="show the worker's connections fall and return once it is idle")
            p.add_argument("--timeout", type=float, default=900, metavar="SECONDS",
                           help="with --wait: give up (exit 1, still drained) after this long "
                           "(default 900: IPVS's own timeout for an established TCP "
                           "connection whose client vanished)")
            p.add_argument("--force", action="store_true",
                           help="drain even if it leaves a service with no worker taking "
                           "connections; in mode ecmp, --all --node --wait waits on the "
                           "balancers named alone")
            p.add_argument("--check", action="store_true",
                           help="only say whether this balancer would accept the drain; "
                           "change nothing (drain --all asks every balancer first)")
        _add_root(p)

    for name, text in (("drain-balancer", "mode ecmp: withdraw this balancer's routes, so the "
                         "router moves its flows to the others, and wait until none arrives; "
                         "kept across restarts until undrain-balancer"),
                       ("undrain-balancer", "mode ecmp: offer the router this balancer's VIPs "
                        "again")):
        p = sub.add_parser(name, parents=[common], help=text)
        p.add_argument("balancer", help="this balancer's name in the cluster file")
        p.add_argument("file", nargs="?", help="the cluster file (default: the one last applied "
                       "on this balancer)")
        if name == "drain-balancer":
            p.add_argument("--timeout", type=float, default=60, metavar="SECONDS",
                           help="give up (exit 1, still withdrawn) if packets for the VIPs "
                           "still arrive after this long (default 60)")
        _add_root(p)

    p = sub.add_parser("rollout", parents=[common],
                       help="update every worker in turn with no failed request: drain, "
                       "wait for idle, run a command, wait for health, undrain")
    p.add_argument("file", help="the cluster file; the balancers are reached over SSH")
    p.add_argument("--exec", required=True, metavar="CMD",
                   help="the update, run here through the shell for each worker, with "
                   "$LBCTL_WORKER, $LBCTL_WORKER_ADDRESS and $LBCTL_CLUSTER set")
    p.add_argument("--batch", type=int, default=1, metavar="N",
                   help="workers taken out at once (default 1)")
    p.add_argument("--pause", type=float, default=0, metavar="SECONDS",
                   help="wait between batches (default 0)")
    p.add_argument("--start-at", metavar="WORKER", help="resume a stopped rollout here")
    p.add_argument("--timeout", type=float, default=900, metavar="SECONDS",
                   help="for a worker to go idle, and again to turn healthy (default 900)")
    p.add_argument("--exec-timeout", type=float, default=1800, metavar="SECONDS",
                   help="for the command, for each worker: past it, the command and what it "
                   "started are stopped and the rollout stops there (default 1800)")
    p.add_argument("--ssh-config", metavar="FILE",
                   help="an ssh_config(5) file for ssh -F (default: ~/.ssh/config)")
    p.add_argument("--yes", action="store_true",
                   help="start without asking (on a terminal, rollout shows its batches and "
                   "asks first; without one it needs --yes)")

    for name, text in (
            ("install", "put this lbctl on the nodes over SSH: the packages each role needs, "
             "a venv in /opt/lbctl and the lbctl command; again to upgrade"),
            ("uninstall", "take lbctl off the nodes over SSH, after `apply --remove --all`")):
        p = sub.add_parser(name, parents=[common], help=text)
        p.add_argument("file", help="the cluster file: its nodes, their roles, how to reach them")
        p.add_argument("--node", help="the nodes to run on: NAME[,NAME...] (default: all)")
        _remote_flags(p)
        if name == "install":
            p.add_argument("--wheel", metavar="FILE",
                           help="lbctl's wheel (default: the one this lbctl was installed "
                           "from, or one built from its checkout)")
            p.add_argument("--wheels", metavar="DIR",
                           help="the dependencies' wheels, for nodes without Internet access "
                           "(pip download -d DIR lbctl-VERSION-py3-none-any.whl)")

    p = sub.add_parser("exporter", parents=[common],
                       help="serve this balancer's health, drains, weights, VRRP role, sync "
                       "and drift as Prometheus metrics")
    p.add_argument("file", nargs="?", help="cluster file to name things by (default: those "
                   "last applied here, read again once an apply changed them)")
    p.add_argument("--listen", metavar="ADDRESS:PORT",
                   help="where to serve /metrics (default 127.0.0.1:9588: this host only)")
    p.add_argument("--drift-every", metavar="S", type=float, default=60.0,
                   help="work drift out at most this often, and after each apply (default 60)")
    _add_root(p)

    p = sub.add_parser("doctor", parents=[common],
                       help="find what breaks direct routing, here and on the LAN, and say "
                       "how to fix each (exit 1 when something is found)")
    p.add_argument("file", nargs="?", help="the cluster file (default: the one last applied "
                   "on this balancer)")
    p.add_argument("--node", help="this node's name (default: found from this host's "
                   "addresses); with --all, the nodes to check: NAME[,NAME...]")
    _remote_flags(p)
    p.add_argument("--json", action="store_true", help="the findings as JSON, for scripts")
    p.add_argument("--no-wire", action="store_true",
                   help="only this node's own checks: send no ARP, SYN or ping probes")
    _add_root(p)

    p = sub.add_parser("lab", parents=[common],
                       help="the cluster in network namespaces, on this machine")
    lab = p.add_subparsers(dest="lab_command", required=True, metavar="LAB_COMMAND",
                           parser_class=Parser)
    d = lab.add_parser("demo", parents=[common],
                       help="build the lab, apply, send traffic, show the result, tear down")
    d.add_argument("file", nargs="?", help="cluster file (default: the bundled failover-pair example)")
    d.add_argument("--requests", type=int, default=12, help="curl requests to show (default 12)")
    p = sub.add_parser("completion", parents=[common],
                       help="print a shell completion script, made from this parser")
    p.add_argument("shell", choices=["bash", "zsh"], help="the shell to complete for")
    sub.add_parser("manpage", parents=[common],
                   help="print lbctl's man page (roff), made from this parser")
    return parser


COMMANDS = {"validate": "validate", "plan": "plan", "apply": "apply", "status": "status",
            "drain": "drain", "undrain": "drain", "rollout": "rollout",
            "drain-balancer": "drain_balancer", "undrain-balancer": "drain_balancer",
            "exporter": "exporter", "doctor": "doctor", "lab": "lab",
            "completion": "completion", "manpage": "completion", "install": "install",
            "uninstall": "install"}

# Commands that change nothing: a reader that goes may end them quietly.
READ_ONLY = {"validate", "plan", "status", "doctor", "completion", "manpage", "exporter"}


def _check_arguments(parser, args):
    if args.command in ("install", "uninstall") and not args.all:
        parser.error(f"{args.command} works on the nodes over SSH, from the machine that "
                     f"drives the cluster: lbctl {args.command} FILE --all")
    if getattr(args, "all", False):
        if args.file in (None, "-"):
            parser.error(f"{args.command} --all needs the cluster file by its path")
        if getattr(args, "root", None) is not None:
            parser.error("--root applies on one node; it cannot be combined with --all")
    elif getattr(args, "node", None) and "," in args.node:
        parser.error("--node names one node, this one; several need --all")
    elif getattr(args, "ssh_config", None) and hasattr(args, "all"):
        parser.error("--ssh-config goes with --all")
    if args.command == "status" and not args.connections and (
            args.service or args.worker or args.client):
        parser.error("--service, --worker and --client go with --connections")
    if args.command == "status" and args.watch and (args.all or args.json or args.connections):
        parser.error("--watch is a live view of this balancer: not with --all, --json or "
                     "--connections")
    if args.command == "status" and args.detailed_exitcode and (
            args.file is None or args.no_drift or args.watch or args.connections):
        parser.error("--detailed-exitcode says whether the node drifted from FILE: it needs "
                     "FILE, and not --no-drift, --watch or --connections")
    if args.command == "status" and args.interval <= 0:
        parser.error("--interval must be more than 0 seconds")
    for flag in ("timeout", "pause"):
        if getattr(args, flag, 0) < 0:
            parser.error(f"--{flag} cannot be negative")
    if args.command == "exporter" and args.drift_every <= 0:
        parser.error("--drift-every must be more than 0 seconds")
    if getattr(args, "connections", False) and args.all:
        parser.error("--connections lists one balancer's table: run it there, without --all")
    if args.command == "rollout" and args.file == "-":
        parser.error("rollout needs the cluster file by its path")
    if args.command == "rollout" and args.batch < 1:
        parser.error("--batch takes at least one worker at a time")
    if args.command == "rollout" and args.exec_timeout <= 0:
        parser.error("--exec-timeout must be more than 0 seconds")
    if args.command == "apply" and args.yes and not args.all:
        parser.error("--yes answers apply --all's question; apply on one node does not ask")
    if args.command == "apply" and args.dry_run:
        # What a user reaching for --dry-run wants is the plan.
        if args.keep_leaving:
            parser.error("--dry-run shows the whole plan: not with --keep-leaving")
        args.command, args.detailed_exitcode, args.fingerprint = "plan", False, False
    if getattr(args, "keep_leaving", False) and (args.remove or args.all):
        parser.error("--keep-leaving is one node's half of a rollout: not with --remove or --all")
    if getattr(args, "remove", False) and getattr(args, "force", False):
        parser.error("--remove deletes every real server at once already; leave out --force")
    if hasattr(args, "root") and args.root is None:
        # $LBCTL_ROOT lets a lab's sshd give each node its own file root.
        args.root = os.environ.get("LBCTL_ROOT") or "/"


def refused_under_sudo(args, environ=None):
    """What in `args` would hand root a program or a file the invoking user
    chose, when lbctl runs under sudo (SUDO_USER set): the reasons, one each.

    A sudo rule for lbctl (README: `NOPASSWD: /usr/local/sbin/lbctl`) is
    meant to let a login apply and inspect a cluster, not to be root."""
    environ = os.environ if environ is None else environ
    if not environ.get("SUDO_USER") or os.geteuid() != 0:
        return []
    reasons = []
    if getattr(args, "ssh_config", None):
        reasons.append("--ssh-config: ssh would read that file as root, and its Match exec "
                       "and ProxyCommand lines run as root")
    if getattr(args, "all", False) or args.command == "rollout":
        what = "rollout" if args.command == "rollout" else f"{args.command} --all"
        reasons.append(f"{what} runs ssh from this machine, which reads ssh's config and keys "
                       "as the user it runs as: run it as yourself, without sudo (each node "
                       "runs its own lbctl with sudo -n)")
    if args.command == "rollout":
        reasons.append("rollout --exec runs a shell command")
    if args.command == "lab":
        reasons.append("lab builds namespaces and runs daemons and web servers as root")
    if args.command == "exporter":
        reasons.append("exporter is a listener that runs for good: its unit runs it as a "
                       "dynamic user without root (apply writes it when the file has "
                       "`exporter:`)")
    if getattr(args, "root", None) is not None or (
            hasattr(args, "root") and environ.get("LBCTL_ROOT")):
        reasons.append("--root (or $LBCTL_ROOT) points root's writes at a tree of the "
                       "user's choosing")
    return reasons


def _os_error_text(exc):
    """What the system refused, and on which path: '/etc/lbctl: not a directory'."""
    reason = (exc.strerror or str(exc) or type(exc).__name__).lower()
    paths = [str(p) for p in (exc.filename, exc.filename2) if p is not None]
    text = f"{' -> '.join(paths)}: {reason}" if paths else reason
    return f"{text}; run as root" if isinstance(exc, PermissionError) else text


def _expected_version(argv):
    """The VERSION of --expect-version, looked for before the rest is parsed:
    a node of another version may not know the other flags --all passes it,
    and must answer with its version, not a usage error."""
    for i, word in enumerate(argv):
        if word == "--":
            break
        if word == "--expect-version" and i + 1 < len(argv):
            following = argv[i + 1]
            return None if following.startswith("-") else following  # argparse says what is wrong
        if word.startswith("--expect-version="):
            return word.partition("=")[2]
    return None


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    expected = _expected_version(argv)
    if expected is not None and expected != __version__:
        print(f"lbctl: this node runs lbctl {__version__}, not {expected}", file=sys.stderr)
        return EXIT_VERSION
    parser = build_parser()
    args = parser.parse_args(argv)
    refused = refused_under_sudo(args)
    if refused:
        print(f"lbctl: {args.command}: refused under sudo (run by "
              f"{os.environ['SUDO_USER']}), before anything ran:\n  "
              + "\n  ".join(refused), file=sys.stderr)
        return 1
    _check_arguments(parser, args)
    debug = getattr(args, "debug", False)
    name = COMMANDS[args.command]
    if getattr(args, "all", False):
        name = f"cluster_{name}"
    module = importlib.import_module(f"lbctl.commands.{name}")
    code = _run(module, args, debug)
    try:
        # Here, where a closed pipe is caught, not at exit: what a command
        # wrote waits in the buffer until now when stdout is a pipe.
        sys.stdout.flush()
    except BrokenPipeError:
        _to_nowhere()
        # The command ran to its end; only its output was lost.
        return EXIT_BROKEN_PIPE if args.command in READ_ONLY else code
    return code


def _run(module, args, debug):
    """The command's exit status, its errors said on stderr."""
    try:
        return module.run(args, sys.stdout)
    except ConfigError as exc:
        for diag in exc.diagnostics:
            print(diag.format(), file=sys.stderr)
        return 1
    except LbctlError as exc:
        if debug:
            raise
        print(f"lbctl: {exc}", file=sys.stderr)
        return exc.exit_code
    except BrokenPipeError:
        # The reader went (`lbctl status --watch | head`): end with a shell
        # tool's status, and without a word where nothing was changed.
        _to_nowhere()
        if args.command not in READ_ONLY:
            try:
                print(f"lbctl: {args.command}: stopped part-way, as its output's reader went "
                      f"away (broken pipe){_where_to_look(args)}", file=sys.stderr)
            except OSError:  # stderr went into the same pipe
                pass
        return EXIT_BROKEN_PIPE
    except OSError as exc:
        if debug:
            raise
        print(f"lbctl: {args.command}: {_os_error_text(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _to_nowhere():
    """stdout to /dev/null: what is still buffered goes nowhere, so the
    flush at exit finds no closed pipe."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _where_to_look(args):
    if args.command == "lab":
        return ""  # the lab takes down what it built as it ends
    if getattr(args, "all", False) or args.command == "rollout":
        return f": `lbctl status {args.file} --all` shows where the cluster stands"
    return ": `lbctl status` shows where this node stands"


if __name__ == "__main__":
    sys.exit(main())

"""drain and undrain --all: every balancer of the file over SSH, so that the
backup agrees with the master when it takes over."""

from lbctl.commands.drain import check_names
from lbctl.config import load_cluster
from lbctl.config.model import Mode
from lbctl.errors import UsageError
from lbctl.remote.blocks import node_block, progress, show_outcomes
from lbctl.remote.fleet import select, vrrp_states
from lbctl.remote.ssh import run_on, run_on_each

# What a waiting node may add to --timeout: ssh, and lbctl's own start.
WAIT_MARGIN = 120


def run(args, out):
    cluster = load_cluster(args.file)
    check_names(cluster, args.worker, args.service)
    balancers = [t for t in select(cluster, args.node) if t.role == "balancer"]
    if not balancers:
        raise UsageError(f"{args.command} acts on balancers, and --node names none")
    force = getattr(args, "force", False)
    left_out = sorted(set(cluster.balancers) - {t.node for t in balancers})
    if cluster.mode == Mode.ECMP and left_out and args.command == "drain" and args.wait \
            and not force:
        # Each balancer carries its share of the connections: idle on some
        # says nothing while the others still send the worker new ones.
        raise UsageError(f"in mode ecmp every balancer the router uses sends {args.worker} "
                         f"connections: --wait needs them all, and --node leaves out "
                         f"{', '.join(left_out)} (--force waits on those named alone, for a "
                         "balancer that is drained with drain-balancer or down)")
    if args.command == "drain" and not force and not _accepted_everywhere(
            cluster, balancers, args.worker, args.service, args.ssh_config, out):
        return 1
    if not on_balancers(cluster, balancers, args.command, args.worker, args.service,
                        args.ssh_config, out, force):
        return 1
    if left_out and args.command == "drain":
        out.write(f"not drained on {', '.join(left_out)}: if it carries the traffic, it still "
                  f"sends {args.worker} new connections\n")
    if args.command == "undrain" or not args.wait:
        return 0
    return 0 if wait_idle(cluster, balancers, args.worker, args.service, args.timeout,
                          args.ssh_config, out) else 1


def _accepted_everywhere(cluster, balancers, worker, service, ssh_config, out):
    """Ask every balancer whether it would take the drain before any of them
    does: one that refuses it (it would leave a service with nobody taking
    connections there) would otherwise leave the pair disagreeing."""
    flags = ["--service", service] if service else []
    progress(f"checking that {', '.join(t.node for t in balancers)} accept draining {worker} ...")
    outcomes = run_on_each(balancers, lambda t: ["drain", worker, "-", "--node", t.node,
                                                 "--check", *flags], cluster.text, ssh_config)
    refused = [t for t in balancers if outcomes[t.node].returncode != 0]
    for target in refused:
        out.write(node_block(outcomes[target.node], "REFUSED", cluster.source) + "\n")
    if refused:
        out.write(f"stopped before any change: {', '.join(t.node for t in refused)} refused "
                  f"to drain {worker}; no balancer was changed\n")
    out.flush()
    return not refused


def on_balancers(cluster, balancers, command, worker, service, ssh_config, out, force=False):
    """drain or undrain `worker` on every balancer at once; False (and what
    failed where) if any of them failed."""
    flags = (["--service", service] if service else []) + (["--force"] if force else [])
    progress(f"{command} {worker} on {', '.join(t.node for t in balancers)} ...")
    outcomes = run_on_each(balancers, lambda t: [command, worker, "-", "--node", t.node,
                                                 *flags], cluster.text, ssh_config)
    failed = show_outcomes(balancers, outcomes, out, cluster.source)
    if failed:
        done = [t.node for t in balancers if t.node not in failed]
        out.write(f"stopped: {command} {worker} failed on {', '.join(failed)}; done on "
                  f"{', '.join(done) or 'no balancer'}\n")
    out.flush()
    return not failed


def wait_idle(cluster, balancers, worker, service, timeout, ssh_config, out):
    """Wait on the balancer that carries the traffic until `worker` is idle;
    True if it became idle in time.

    The master carries the connections; the backup's copies follow its sync
    messages, and one lost message must not hold the wait up.  In mode
    ecmp every balancer carries them, and a flow the router moved leaves an
    entry behind: each connection counts once (remote/idle.py)."""
    if cluster.mode == Mode.ECMP:
        from lbctl.remote.idle import wait_idle_across

        return wait_idle_across(cluster, balancers, worker, service, timeout, ssh_config, out)
    flags = ["--service", service] if service else []
    states = vrrp_states(cluster, balancers, ssh_config)
    carrying = [t for t in balancers if states.get(t.node) == "MASTER"] or balancers
    idle = True
    for target in carrying:
        outcome = run_on(target, ["drain", worker, "-", "--node", target.node, "--wait",
                                  "--timeout", f"{timeout:g}", *flags],
                         cluster.text, ssh_config, timeout=timeout + WAIT_MARGIN,
                         show_stderr=True)
        out.write(node_block(outcome, "idle" if outcome.returncode == 0 else "NOT IDLE") + "\n")
        idle = idle and outcome.returncode == 0
    out.flush()
    return idle

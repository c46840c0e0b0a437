"""apply --all: every node over SSH, in an order that keeps traffic flowing."""

import re
import time
from dataclasses import replace

from lbctl import __version__
from lbctl.commands.cluster_plan import plan_each
from lbctl.config import load_cluster
from lbctl.config.model import Mode
from lbctl.errors import EXIT_VERSION
from lbctl.engine.plan import DEFERRED_MARK, DRAINING_MARK
from lbctl.remote.fleet import back_in_service, balancers_now, bgp_offers, rollout_stages, select
from lbctl.remote.ssh import run_on_each
from lbctl.remote.blocks import node_block, progress, show_outcomes
from lbctl.remote.confirm import CANCELLED, ask, require_a_way_to_ask

# Mode ecmp: how long a balancer just applied may take to serve again (its
# BGP session back, its checks passed, its VIPs offered) before the rollout
# stops rather than take the next balancer out too.
ECMP_SETTLE_TIMEOUT = 120.0
ECMP_SETTLE_POLL = 1.0


def run(args, out):
    cluster = load_cluster(args.file)  # a bad file stops here, before any node is contacted
    selected = select(cluster, args.node)
    require_a_way_to_ask("apply --all" + (" --remove" if args.remove else ""), args.yes,
                         out=out)
    agreed = {}  # name: the fingerprint of the plan shown and agreed to
    # Mode ecmp plans every node first, with --yes too: a balancer that
    # refuses the file (a worker order its mh table cannot take) would stop
    # the rollout after the balancers before it had changed, and their
    # tables would differ.
    if args.yes and (cluster.mode != Mode.ECMP or args.remove):
        if not _same_lbctl_everywhere(selected, args.ssh_config, out):
            return 1
    else:
        # The plans shown before the question run with --expect-version too:
        # they are the check, and a node pays for one lbctl start less.
        declined, agreed = _show_and_ask(args, cluster, selected, out, question=not args.yes)
        if declined is not None:
            return declined
    serving = {}
    if cluster.mode == Mode.ECMP and not args.remove:
        # What each balancer offers the router before any of them changes.
        balancers = [t for t in selected if t.role == "balancer"]
        serving = bgp_offers(cluster, balancers, args.ssh_config) if balancers else {}
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=1) as pool:
        # Which balancer is master now, asked while the workers apply.
        asked = pool.submit(balancers_now, cluster, selected, args.ssh_config)
        stages = rollout_stages(cluster, selected, asked.result, removing=args.remove)
        return _roll_out(args, cluster, selected, stages, out, serving, agreed)


def _roll_out(args, cluster, selected, stages, out, serving=None, agreed=None):
    flags = (["--remove"] if args.remove else []) + (["--force"] if args.force else [])
    done, total, leaving, draining = [], len(selected), [], set()
    for label, stage in stages:
        # Workers go first with additions only; what they give up (an old VIP)
        # goes once no balancer sends them traffic for it.
        first_pass = ["--keep-leaving"] if label == "workers" and not args.remove else []
        failed, held_back, still = _stage(args, cluster, label, stage, flags + first_pass, done,
                                          out, total, agreed)
        if failed:
            return _stopped(selected, done, failed, out)
        if serving and label == "balancer" and serving[stage[0].node][0] == "Established":
            # Mode ecmp: the next balancer goes out only once this one is back.
            (target,) = stage
            problem = _wait_serving(cluster, target, serving[target.node], args.ssh_config)
            if problem:
                return _stopped(selected, done, [], out, f"{target.node} {problem}")
        leaving += held_back
        draining |= still
    if leaving:
        finish, wait, why = _second_pass(cluster, selected, leaving, draining)
        if finish:
            failed, _, _ = _stage(args, cluster, "workers, removals", finish, flags, done, out)
            if failed:
                done[:] = [n for n in done if n not in failed]
                return _stopped(selected, done, failed, out)
        if wait:
            out.write(f"removals held back on {', '.join(wait)}: {why}; "
                      "run `lbctl apply FILE --all` again later\n")
    what = "lbctl removed from" if args.remove else "applied on"
    out.write(f"{what} {len(done)} node(s): {', '.join(done)}\n")
    return 0


def _show_and_ask(args, cluster, selected, out, question=True):
    """Each node's plan, then the question (unless not `question`): (None
    to go ahead, else the exit status to stop with, nothing changed; {name:
    fingerprint of the plan shown})."""
    pending, failed, fingerprints, wrong = plan_each(cluster, selected, args, out,
                                                     fingerprints=True)
    unsure = [t for t in selected if t.node in failed and t.node not in wrong]
    if unsure:
        # An lbctl from before the version was checked ahead of the flags
        # answers a flag it does not know with a usage error: ask it.
        wrong += _other_lbctl(unsure, args.ssh_config, out)
    if wrong:
        _name_other_lbctl(wrong, selected, out)
        return 1, {}
    if failed:
        planned = [t.node for t in selected if t.node not in failed]
        out.write(f"could not plan on {', '.join(failed)}; nothing was changed"
                  + (f" (to go on without {'it' if len(failed) == 1 else 'them'}: "
                     f"--node {','.join(planned)})" if planned else "") + "\n")
        return 1, {}
    if not question:
        return None, fingerprints
    if not pending:
        # Nothing to ask about; apply still checks what runs on each node
        # (keepalived's table against its config), as with --yes.
        out.write(f"no changes planned on {len(selected)} node(s); applying to check them\n")
        return None, fingerprints
    verb = "Remove lbctl from" if args.remove else "Apply these changes to"
    if not ask(f"{verb} {', '.join(pending)}?", out=out):
        out.write(f"{CANCELLED}\n")
        return 1, {}
    return None, fingerprints


def _same_lbctl_everywhere(selected, ssh_config, out):
    """With --yes, where no plan is shown first: whether every node runs
    this lbctl, asked before any node changes.  A node with another version
    (or none) would stop the rollout half way, with the nodes before it
    already changed.  A node that cannot be reached is left to the rollout
    itself, which stops there and says what it did."""
    progress(f"checking lbctl on {', '.join(t.node for t in selected)} ...")
    wrong = _other_lbctl(selected, ssh_config, out)
    if wrong:
        _name_other_lbctl(wrong, selected, out)
    return not wrong


def _other_lbctl(targets_, ssh_config, out):
    """The names of `targets_` that run another lbctl or none, each shown."""
    # --version answers the --expect-version every remote command carries,
    # and reads no file: the cheapest lbctl start there is.
    outcomes = {node: _version_told(outcome) for node, outcome in
                run_on_each(targets_, lambda t: ["--version"], "", ssh_config).items()}
    wrong = [t.node for t in targets_ if outcomes[t.node].runs_other_lbctl]
    for target in targets_:
        if target.node in wrong:
            out.write(node_block(outcomes[target.node], "FAILED") + "\n")
    return wrong


def _version_told(outcome):
    """An lbctl from before --version answered --expect-version says its
    version and exits 0: read as the refusal a newer one gives."""
    # The last line that names a version: a login shell may print first.
    told = [line for line in outcome.stdout.splitlines() if re.fullmatch(r"lbctl \S+", line)]
    if outcome.returncode == 0 and told[-1:] != [f"lbctl {__version__}"]:
        version = told[-1].removeprefix("lbctl ") if told else "of a version it does not name"
        return replace(outcome, returncode=EXIT_VERSION, stdout="",
                       stderr=f"lbctl: this node runs lbctl {version}, not {__version__}\n")
    return outcome


def _name_other_lbctl(wrong, selected, out):
    out.write(f"stopped before any change: {', '.join(wrong)} must run lbctl "
              f"{__version__} first; not touched: {', '.join(t.node for t in selected)}\n")


def _second_pass(cluster, selected, leaving, draining):
    """(workers whose held-back removals may go now, names of those that must
    wait, why they wait).

    A worker may give up a VIP only once no balancer sends it traffic for it:
    every balancer of the file was applied in this run, and none still drains
    connections to that worker.
    """
    if not set(cluster.balancers) <= {t.node for t in selected}:
        return [], [t.node for t in leaving], "not every balancer was applied in this run"
    addresses = {str(w.address): name for name, w in cluster.workers.items()}
    busy = {addresses.get(a) for a in draining}
    return ([t for t in leaving if t.node not in busy], [t.node for t in leaving if t.node in busy],
            "a balancer still drains connections to them")


def _stage(args, cluster, label, stage, flags, done, out, total=None, agreed=None):
    """Apply on one stage's nodes at once: ([failed names], [targets that held
    removals back], {real server addresses a balancer still drains}).
    `agreed`: {name: fingerprint}, the plans shown before the question; a
    node whose plan has changed since changes nothing."""
    agreed = agreed or {}

    def argv(target):
        expect = ["--expect-plan", agreed[target.node]] if target.node in agreed else []
        return ["apply", "-", "--node", target.node, *flags, *expect]

    count = f"[{len(done) + 1}-{len(done) + len(stage)}/{total}] " if total else ""
    progress(f"{count}{'removing from' if args.remove else 'applying on'} {label} "
             f"{', '.join(t.node for t in stage)} ...")
    outcomes = run_on_each(stage, argv, cluster.text, args.ssh_config)
    failed = show_outcomes(stage, outcomes, out, cluster.source)
    held_back, draining = [], set()
    for target in stage:
        outcome = outcomes[target.node]
        if target.node in failed:
            continue
        if target.node not in done:
            done.append(target.node)
        if DEFERRED_MARK in outcome.stdout:
            held_back.append(target)
        for line in outcome.stdout.splitlines():
            if line.startswith(DRAINING_MARK + ":"):
                draining |= set(line.partition(":")[2].split())
    return failed, held_back, draining


def _wait_serving(cluster, target, before, ssh_config, timeout=None, poll=None):
    """None once the ECMP balancer just applied serves as before
    (fleet.back_in_service); else why the rollout must stop."""
    timeout = ECMP_SETTLE_TIMEOUT if timeout is None else timeout
    poll = ECMP_SETTLE_POLL if poll is None else poll
    progress(f"waiting for {target.node} to offer the router its VIPs again ...")
    deadline = time.monotonic() + timeout
    while True:
        now = bgp_offers(cluster, [target], ssh_config)[target.node]
        if back_in_service(cluster, before, now):
            return None
        if time.monotonic() >= deadline:
            state, offered = now
            missing = sorted(before[1] - offered)
            said = [f"BGP {state or 'unknown'}"] + (
                [f"not offering {', '.join(missing)}"] if missing else [])
            return (f"is not serving again {timeout:g}s after its apply ({'; '.join(said)}); "
                    "the other balancers were left as they are")
        time.sleep(poll)


def _stopped(selected, done, failed, out, why=None):
    untouched = [t.node for t in selected if t.node not in done and t.node not in failed]
    reason = f"failed on {', '.join(failed)}" if failed else why
    out.write(f"stopped: {reason}; done on {', '.join(done) or 'no node'}; "
              f"not touched: {', '.join(untouched) or 'none'}\n")
    return 1

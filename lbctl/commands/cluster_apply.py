"""apply --all: every node over SSH, in an order that keeps traffic flowing."""

from concurrent.futures import ThreadPoolExecutor

from lbctl.config import load_cluster
from lbctl.plan import DEFERRED_MARK, DRAINING_MARK
from lbctl.remote.fleet import balancers_now, rollout_stages, select
from lbctl.remote.ssh import run_on_each
from lbctl.remote.blocks import progress, show_outcomes


def run(args, out):
    cluster = load_cluster(args.file)  # a bad file stops here, before any node is contacted
    selected = select(cluster, args.node)
    with ThreadPoolExecutor(max_workers=1) as pool:
        # Which balancer is master now, asked while the workers apply.
        asked = pool.submit(balancers_now, cluster, selected, args.ssh_config)
        stages = rollout_stages(cluster, selected, asked.result, removing=args.remove)
        return _roll_out(args, cluster, selected, stages, out)


def _roll_out(args, cluster, selected, stages, out):
    flags = (["--remove"] if args.remove else []) + (["--force"] if args.force else [])
    done, total, leaving, draining = [], len(selected), [], set()
    for label, stage in stages:
        # Workers go first with additions only; what they give up (an old VIP)
        # goes once no balancer sends them traffic for it.
        first_pass = ["--keep-leaving"] if label == "workers" and not args.remove else []
        failed, held_back, still = _stage(args, cluster, label, stage, flags + first_pass, done,
                                          out, total)
        if failed:
            return _stopped(selected, done, failed, out)
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


def _stage(args, cluster, label, stage, flags, done, out, total=None):
    """Apply on one stage's nodes at once: ([failed names], [targets that held
    removals back], {real server addresses a balancer still drains})."""
    count = f"[{len(done) + 1}-{len(done) + len(stage)}/{total}] " if total else ""
    progress(f"{count}{'removing from' if args.remove else 'applying on'} {label} "
             f"{', '.join(t.node for t in stage)} ...")
    outcomes = run_on_each(stage, lambda t: ["apply", "-", "--node", t.node, *flags],
                           cluster.text, args.ssh_config)
    failed = show_outcomes(stage, outcomes, out)
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


def _stopped(selected, done, failed, out):
    untouched = [t.node for t in selected if t.node not in done and t.node not in failed]
    out.write(f"stopped: failed on {', '.join(failed)}; done on {', '.join(done) or 'no node'}; "
              f"not touched: {', '.join(untouched) or 'none'}\n")
    return 1

"""rollout: update every worker in turn without failing a request.

For each worker (or batch): drain it on every balancer, wait until the
balancer carrying the traffic holds no connection to it, run the user's
command with the worker's name and address in its environment, wait until
its health checks pass on every balancer, and undrain it.  Anything that
fails stops the rollout there, with that worker left drained.
"""

import os
import subprocess
import sys
import time

from lbctl.commands.cluster_drain import on_balancers, wait_idle
from lbctl.config import load_cluster
from lbctl.errors import UsageError
from lbctl.remote.blocks import progress
from lbctl.remote.confirm import CANCELLED, ask, require_a_way_to_ask
from lbctl.remote.ssh import targets

HEALTH_POLL = 2.0  # seconds between asking the balancers for health


def run(args, out):
    cluster = load_cluster(args.file)
    require_a_way_to_ask("rollout", args.yes, out=out)
    balancers = [t for t in targets(cluster).values() if t.role == "balancer"]
    order = serving_workers(cluster)
    if args.start_at is not None:
        if args.start_at not in order:
            raise UsageError(f"--start-at: {args.start_at!r} is not a worker that serves a "
                             f"service in {cluster.source} ({', '.join(order)})")
        order = order[order.index(args.start_at):]
    batches = [order[i:i + args.batch] for i in range(0, len(order), args.batch)]
    if not args.yes and not _agreed(args, balancers, batches, out):
        out.write(f"{CANCELLED}\n")
        return 1
    done = []
    for number, batch in enumerate(batches):
        if number and args.pause:
            progress(f"pausing {args.pause:g}s before {', '.join(batch)}")
            time.sleep(args.pause)
        problem = _one_batch(args, cluster, balancers, batch, out)
        if problem:
            return _stopped(args, order, done, batch, problem, out)
        done += batch
    out.write(f"rolled out to {len(done)} worker(s): {', '.join(done)}\n")
    return 0


def _agreed(args, balancers, batches, out):
    """What the rollout will do, batch by batch, and the question."""
    out.write(f"rollout: for each batch, drain it on {', '.join(t.node for t in balancers)}, "
              f"wait until idle, run `{args.exec}`, wait until healthy, undrain\n")
    for number, batch in enumerate(batches, 1):
        out.write(f"  {number}. {', '.join(batch)}\n")
    workers = sum(len(batch) for batch in batches)
    return ask(f"Roll out to {workers} worker(s)?", out=out)


def serving_workers(cluster):
    """The workers in the file's order, those that serve at least one service."""
    serving = {rs.worker for svc in cluster.services.values() for rs in svc.real_servers}
    return [name for name in cluster.workers if name in serving]


def _one_batch(args, cluster, balancers, batch, out):
    """None when the batch went through; else what stopped it."""
    ssh = args.ssh_config
    for worker in batch:
        if not on_balancers(cluster, balancers, "drain", worker, None, ssh, out):
            return f"drain {worker} failed"
    for worker in batch:
        if not wait_idle(cluster, balancers, worker, None, args.timeout, ssh, out):
            return f"{worker} still had connections after {args.timeout:g}s"
    for worker in batch:
        code = run_command(args.exec, cluster, worker, out, args.exec_timeout)
        if code is None:
            return (f"the command for {worker} ran past {args.exec_timeout:g}s "
                    "(--exec-timeout) and was stopped")
        if code != 0:
            return f"the command exited {code} for {worker}"
    finished = time.monotonic()
    for worker in batch:
        healthy, why = wait_healthy(cluster, balancers, worker, finished, args.timeout, ssh)
        if not healthy:
            return f"{worker} did not turn healthy within {args.timeout:g}s ({why})"
        out.write(f"{worker}: {why}\n")
    for worker in batch:
        if not on_balancers(cluster, balancers, "undrain", worker, None, ssh, out):
            return f"undrain {worker} failed"
    return None


def run_command(command, cluster, worker, out, timeout=None):
    """The user's command, through the shell as they typed it; the worker comes
    in the environment, never spliced into the command text.  Its exit
    status, or None when it ran past `timeout` seconds and was stopped, with
    every process it started that is still its own."""
    address = str(cluster.workers[worker].address)
    progress(f"running the command for {worker} ({address}) ...")
    out.flush()
    env = os.environ | {"LBCTL_CLUSTER": cluster.name, "LBCTL_WORKER": worker,
                        "LBCTL_WORKER_ADDRESS": address}
    # In lbctl's own process group, so a command that asks (ssh, sudo) still
    # has the terminal; a timeout stops it and its descendants one by one.
    proc = subprocess.Popen(command, shell=True, env=env)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        _stop_tree(proc)
        return None


def _stop_tree(proc, grace=5.0):
    """SIGTERM to the command's shell and everything below it, then SIGKILL
    to whatever did not end within `grace` seconds.

    Each process is held by a pidfd from the moment it is found, and the
    tree is read again before the SIGKILL: a process started after the
    SIGTERM is caught too, and a pid freed and reused by some other program
    meanwhile is never signalled (a pidfd names one process, not a number)."""
    import select
    import signal

    held = {}  # pid: pidfd

    def gather():
        for pid in [proc.pid, *_descendants(proc.pid),
                    *(d for known in list(held) for d in _descendants(known))]:
            if pid not in held:
                try:
                    held[pid] = os.pidfd_open(pid)
                except OSError:
                    pass  # ended already

    def exited(fd):  # a pidfd reads ready once its process has ended
        return bool(select.select([fd], [], [], 0)[0])

    try:
        for signum in (signal.SIGTERM, signal.SIGKILL):
            gather()
            for fd in held.values():
                try:
                    signal.pidfd_send_signal(fd, signum)
                except ProcessLookupError:
                    pass
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                continue
            if signum == signal.SIGTERM:
                deadline = time.monotonic() + grace
                while time.monotonic() < deadline and not all(map(exited, held.values())):
                    time.sleep(0.05)
                gather()
                if all(map(exited, held.values())):
                    return
        proc.wait()
    finally:
        for fd in held.values():
            os.close(fd)


def _descendants(pid):
    """The pids below `pid`, read from /proc (children, theirs, ...)."""
    children = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        below = children.get(todo.pop(), [])
        found += below
        todo += below
    return found


def checked_services(cluster, worker):
    return [svc for svc in sorted(cluster.services.values(), key=lambda s: s.name)
            if svc.health is not None and any(rs.worker == worker for rs in svc.real_servers)]


def detection_seconds(services):
    """How long a check takes to see a broken server: its retries, one interval more."""
    return max((s.health.retries * (s.health.interval + s.health.timeout) + s.health.interval
                for s in services), default=0)


def wait_healthy(cluster, balancers, worker, since, timeout, ssh_config,
                 clock=time.monotonic, sleep=time.sleep, ask=None):
    """(True, how) once every check of the worker passes on every balancer, at
    least a detection time after `since` (the command's end), so a server the
    command broke is seen as down first; (False, what is missing) at timeout."""
    services = checked_services(cluster, worker)
    if not services:
        return True, "no health check in the file: undrained once the command succeeded"
    ask = ask or (lambda: _health_reports(cluster, balancers, ssh_config))
    sleep(max(0.0, since + detection_seconds(services) - clock()))
    deadline = clock() + timeout
    while True:
        missing = []
        reports = ask()
        for target in balancers:
            health = reports.get(target.node)
            for svc in services:
                state = None if health is None else health.get((svc.name, worker))
                if state != "up":
                    missing.append(f"{svc.name} on {target.node}: {state or 'not reported'}")
        if not missing:
            return True, f"healthy on {', '.join(t.node for t in balancers)}"
        if clock() >= deadline:
            return False, "; ".join(missing)
        sleep(HEALTH_POLL)


def _health_reports(cluster, balancers, ssh_config):
    """{balancer: {(service, worker): "up"/"down"}}, or None for one that did not answer."""
    from lbctl.remote.fleet import statuses

    reports = {}
    for node, status in statuses(cluster, balancers, ssh_config).items():
        info = None if status is None else status.keepalived.get(cluster.name)
        reports[node] = None if info is None else {
            pair: h.state for pair, h in info.health_by_pair().items()}
    return reports


def _stopped(args, order, done, batch, problem, out):
    untouched = [w for w in order if w not in done and w not in batch]
    out.write(f"stopped at {', '.join(batch)}: {problem}.\n"
              f"  left as the blocks above show: drained where the drain succeeded "
              f"(no new connections there); `lbctl undrain WORKER {args.file} --all` puts "
              "one back\n"
              f"  done: {', '.join(done) or 'none'}; not started: {', '.join(untouched) or 'none'}\n"
              f"  to resume once fixed: lbctl rollout {args.file} --exec ... "
              f"--start-at {batch[0]}{' --yes' if args.yes else ''}  (drains {batch[0]} "
              "again, reruns the command, and "
              "undrains it once healthy)\n")
    print(f"lbctl: rollout stopped at {', '.join(batch)}: {problem}", file=sys.stderr)
    return 1

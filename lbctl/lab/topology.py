"""The cluster in network namespaces: one bridge, a client, the balancer, the workers.

Each node gets its own namespace with eth0 on a shared bridge, its own file
root for what lbctl writes (--root), and, on workers, a real HTTP server
(busybox httpd) and a UDP responder that name the worker in their replies.
lbctl runs inside each namespace exactly as it would on a Pi.
"""

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from lbctl.config import load_cluster
from lbctl.errors import LabError
from lbctl.lab.faults import Faults
from lbctl.lab.observe import Observations
from lbctl.lab.shell import DEFAULT_TIMEOUT, ip_batch, netns_exists, pids_in, remove_tree, run
from lbctl.lab.warm import WarmLbctl
from lbctl.layout import Layout

BLOB_BYTES = 1 << 20  # the file the DSR proof downloads
# What curl writes after each answer of Lab.ask: the answers are split there.
ANSWER_END = "--lbctl-lab-answer-end--"


@dataclass
class LabNode:
    name: str
    role: str  # client, balancer, worker
    address: str
    netns: str
    root: str
    processes: list = field(default_factory=list)


class Lab(Faults, Observations):
    """A lab whose namespaces come from `cluster`; apply may use other files
    later.  What it breaks on purpose (faults.py) and what it reads off the
    nodes (observe.py) are parts of it."""

    def __init__(self, cluster, cluster_file, prefix="lab"):
        self.cluster = cluster
        self.cluster_file = os.path.abspath(cluster_file)
        self.prefix = prefix
        # Under /run, not /tmp: keepalived runs lab scripts only from paths that
        # no other user can write, and every node's root lives in here.
        self.workdir = tempfile.mkdtemp(prefix="lbctl-lab-", dir="/run")
        os.chmod(self.workdir, 0o755)
        self.lan = f"{prefix}-lan"
        self.nodes = {}
        self.warm = {}  # node: its WarmLbctl, started on first use
        prefixlen = cluster.network.prefixlen
        self.prefixlen = prefixlen
        for name, b in cluster.balancers.items():
            self._add_node(name, "balancer", str(b.address))
        for name, w in cluster.workers.items():
            self._add_node(name, "worker", str(w.address))
        self._add_node("client", "client", str(self._client_address()))

    def _add_node(self, name, role, address):
        root = os.path.join(self.workdir, name)
        os.makedirs(root)
        self.nodes[name] = LabNode(name, role, address, f"{self.prefix}-{name}", root)

    def add_client(self, name, address):
        """Another client on the LAN, from an address of its own; before build()."""
        self._add_node(name, "client", str(address))

    def _client_address(self):
        used = {a for a in self.cluster.node_names_by_address()} | set(self.cluster.vips)
        for host in reversed(list(self.cluster.network.hosts())):
            if host not in used:
                return host
        raise LabError(f"no free address for the lab client in {self.cluster.network}")

    # -- building ------------------------------------------------------------
    def build(self, servers=True):
        """`servers`: start each worker's web and UDP servers here (True), or
        only those of the workers named; nodes that boot their own
        (systemd.py) are left out."""
        self.teardown(quiet=True)
        ip_batch([["netns", "add", self.lan]])
        ip_batch([["link", "add", "br0", "type", "bridge"], ["link", "set", "br0", "up"]],
                 netns=self.lan)
        for node in self.nodes.values():
            self.wire(node.name)
            if node.role == "worker" and (servers is True or
                                          servers and node.name in servers):
                self._start_servers(node)
        return self

    def wire(self, name):
        """A fresh namespace for the node, its eth0 on the LAN: what a node's kernel
        holds after a power cycle.  An earlier namespace of the node is deleted.
        One `ip` for each namespace's part: a process start is what costs."""
        node = self.nodes[name]
        peer = f"p{list(self.nodes).index(name)}"
        if netns_exists(node.netns):
            # The old pair goes even if a process still holds the old namespace.
            run(["ip", "-n", self.lan, "link", "del", peer], check=False)
            run(["ip", "netns", "del", node.netns], check=False)
        ip_batch([["netns", "add", node.netns],
                  ["link", "add", "eth0", "netns", node.netns, "type", "veth",
                   "peer", "name", peer, "netns", self.lan]])
        ip_batch([["link", "set", peer, "master", "br0", "up"]], netns=self.lan)
        ip_batch([["address", "add", f"{node.address}/{self.prefixlen}", "dev", "eth0"],
                  ["link", "set", "eth0", "up"], ["link", "set", "lo", "up"],
                  *self._wired_routes(name)], netns=node.netns)
        self.sh(name, ["sysctl", "-q", "-w",
                       *(f"{key}={value}" for key, value in self._wired_sysctls(name).items())])

    def _wired_sysctls(self, name):
        """{key: value} a node's kernel gets as it is wired.  A fresh namespace
        starts from the kernel defaults for ARP; make the lab start from them
        even where the host set conf/all."""
        return {f"net.ipv4.conf.{scope}.{key}": "0"
                for key in ("arp_ignore", "arp_announce") for scope in ("all", "eth0")}

    def _wired_routes(self, name):
        """`ip route` commands a node gets as it is wired, past its LAN's."""
        return []

    def _start_servers(self, node):
        docroot = os.path.join(self.workdir, f"{node.name}-www")
        os.makedirs(docroot)
        with open(os.path.join(docroot, "index.html"), "w") as fh:
            fh.write(f"served by {node.name}\n")
        with open(os.path.join(docroot, "blob"), "wb") as fh:
            fh.write(os.urandom(BLOB_BYTES))
        self._spawn_web_server(node)
        for svc in self.cluster.services.values():
            if svc.protocol == "udp" and any(rs.worker == node.name for rs in svc.real_servers):
                self.spawn(node.name, [sys.executable, "-m", "lbctl.lab.udp_responder",
                                       "--name", node.name, "--port", str(svc.port),
                                       "--bind", "0.0.0.0"])
        self._wait_listening(node, 80)

    def _spawn_web_server(self, node):
        # Inside its own namespace the worker listens on every address: the
        # VIP on lo is how direct-routed requests reach it.  It is always the
        # worker's first process, so tests can stop and restart it.
        docroot = os.path.join(self.workdir, f"{node.name}-www")
        proc = subprocess.Popen(
            ["ip", "netns", "exec", node.netns, "busybox", "httpd", "-f", "-p", "0.0.0.0:80",
             "-h", docroot], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if node.processes:
            node.processes[0] = proc
        else:
            node.processes.append(proc)

    def web_server(self, name):
        """A worker's web server process."""
        return self.nodes[name].processes[0]

    def ensure_web_server(self, name):
        """Restart a worker's web server that a test stopped, and wait until it listens."""
        node = self.nodes[name]
        if self.web_server(name).poll() is not None:
            self._spawn_web_server(node)
        self._wait_listening(node, 80)

    def _wait_listening(self, node, port, timeout=30):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            out = self.sh(node.name, ["ss", "-Hltn", f"sport = :{port}"], check=False).stdout
            if out.strip():
                return
            time.sleep(0.2)
        raise LabError(f"{node.name}: nothing listening on port {port} after {timeout}s")

    # -- driving -------------------------------------------------------------
    def sh(self, node, argv, check=True, **kw):
        return run(["ip", "netns", "exec", self.nodes[node].netns] + list(argv), check=check, **kw)

    def spawn(self, node, argv):
        proc = subprocess.Popen(["ip", "netns", "exec", self.nodes[node].netns] + list(argv),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.nodes[node].processes.append(proc)
        return proc

    def lbctl_argv(self, *args, node):
        """lbctl's command line on a node, with the node's own file root for apply and plan."""
        return [sys.executable, "-m", "lbctl", *self.lbctl_args(*args, node=node)]

    def lbctl_args(self, *args, node):
        """lbctl's arguments on a node: `args`, and the node's own file root
        for the commands that read or write the node's files."""
        if args and args[0] in ("apply", "plan", "status", "drain", "undrain", "drain-balancer",
                                "undrain-balancer"):
            return [*args, "--root", self.nodes[node].root]
        return list(args)

    def lbctl(self, node, *args, check=False, timeout=DEFAULT_TIMEOUT):
        """Run lbctl on a node as a user would: inside its namespace, a new
        process with lbctl's modules already imported (warm.py)."""
        done = self.warm_lbctl(node).run(self.lbctl_args(*args, node=node), timeout)
        if check and done.returncode != 0:
            raise LabError(f"lbctl {' '.join(map(str, args))} on {node}: "
                           f"{(done.stderr or done.stdout).strip()}")
        return done

    def warm_socket(self, node):
        """The socket of the node's warm lbctl, started if it is not running."""
        warm = self.warm_lbctl(node)
        warm.ensure()
        return warm.path

    def warm_lbctl(self, node):
        """The node's warm lbctl (warm.py), made on first use: its run() takes
        lbctl's arguments as they are, with no file root added."""
        if node not in self.warm:
            folder = os.path.join(self.workdir, ".warm")
            os.makedirs(folder, mode=0o700, exist_ok=True)
            self.warm[node] = WarmLbctl(self.nodes[node].netns,
                                        os.path.join(folder, f"{node}.sock"))
        return self.warm[node]

    def apply_all(self, cluster_file=None, extra=()):
        """Apply on every worker (in parallel), then on the balancers, as a rollout would."""
        path = str(cluster_file or self.cluster_file)
        declared = load_cluster(path)
        workers = [n for n in declared.workers if n in self.nodes]
        balancers = [n for n in declared.balancers if n in self.nodes]
        results = {}
        for group in (workers, balancers):
            with ThreadPoolExecutor(max(1, len(group))) as pool:
                applied = pool.map(lambda name: self.lbctl(name, "apply", path, *extra), group)
                results.update(zip(group, applied))
        return results

    def curl(self, url, node="client", timeout=5):
        return self.sh(node, ["curl", "-sS", "--max-time", str(timeout), url], check=False)

    def ask(self, url, count, node="client", timeout=5, source=None):
        """What `count` GETs of `url` from `node` were answered, each on a new
        connection (so each is scheduled anew): its body, or "failed".  One
        curl makes them all: in the emulated lab a curl costs more to start
        than its requests take.  `source`: the node's address to send from."""
        bound = ["--interface", source] if source else []
        out = self.sh(node, ["curl", "-sS", "--max-time", str(timeout), *bound,
                             "-H", "Connection: close",
                             "-w", f"\n{ANSWER_END}\n", *[url] * count], check=False).stdout
        answers = out.split(f"\n{ANSWER_END}\n")[:count]
        return [a.strip() or "failed" for a in answers] + ["failed"] * (count - len(answers))

    def udp_ask(self, address, port, node="client", count=1, timeout=2):
        code = ("import socket,sys\n"
                "for _ in range(int(sys.argv[3])):\n"
                " s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM); s.settimeout(float(sys.argv[4]))\n"
                " s.sendto(b'who', (sys.argv[1], int(sys.argv[2])))\n"
                " try: print(s.recv(2048).decode().strip())\n"
                " except OSError: print('timeout')\n")
        out = self.sh(node, [sys.executable, "-c", code, str(address), str(port), str(count),
                             str(timeout)]).stdout
        return out.splitlines()

    def hold_connections(self, address, port, count, seconds, node="client"):
        """Open `count` TCP connections and keep them established for `seconds`.

        Each sends the start of a request and waits, as a slow client would, so
        the balancer counts them as active until the holder process ends.
        """
        code = ("import socket,sys,time\n"
                "socks=[socket.create_connection((sys.argv[1], int(sys.argv[2])))"
                " for _ in range(int(sys.argv[3]))]\n"
                "[s.sendall(b'GET /') for s in socks]\n"
                "time.sleep(float(sys.argv[4]))\n")
        return self.spawn(node, [sys.executable, "-c", code, str(address), str(port),
                                 str(count), str(seconds)])

    def traffic(self, kind, *args, node="client"):
        """Start a measuring client (lbctl.lab.traffic), and return once it is
        under way; `finish()` it for its JSON."""
        proc = subprocess.Popen(["ip", "netns", "exec", self.nodes[node].netns, sys.executable,
                                 "-m", "lbctl.lab.traffic", kind, *map(str, args)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        # Its started line, or the first line of why it ended: finish() raises then.
        proc.stderr.readline()
        return proc

    @staticmethod
    def hurry(proc):
        """Let slow downloads (traffic "downloads") finish at full speed."""
        proc.send_signal(signal.SIGUSR1)

    @staticmethod
    def finish(proc, timeout=300):
        out, err = proc.communicate(timeout=timeout)
        if proc.returncode != 0:
            raise LabError(f"lab client failed: {err.strip()}")
        return json.loads(out)

    # -- lbctl's files on a node ----------------------------------------------
    def layout(self, node, cluster_name=None):
        """lbctl's paths on a node, for the lab's cluster (or the one named)."""
        return Layout(cluster_name or self.cluster.name, self.nodes[node].root)

    def path(self, node, attribute, *args, cluster_name=None):
        """A path of the node's layout as this machine reaches it:
        path("lb1", "pid_file", "vrrp"), path("lb1", "drain_record")."""
        layout = self.layout(node, cluster_name)
        found = getattr(layout, attribute)
        return layout.real(found(*args) if callable(found) else found)

    def wait_for(self, predicate, timeout=30, what="condition"):
        """Until predicate() is true.  It is asked every 0.1 s at first, then
        at an eighth of the time waited so far (at most each second): most
        predicates start processes in the node (curl, ipvsadm, ip), the
        emulated lab's CPUs are what the suite's time is made of, and a long
        wait is for a timer (an advert, a hold time) that 0.1 s polls do not
        hurry.  What a wait is seen to take stays within an eighth of it."""
        started = time.monotonic()
        deadline = started + timeout
        while not predicate():
            now = time.monotonic()
            if now >= deadline:
                raise LabError(f"timed out after {timeout}s waiting for {what}")
            time.sleep(min(max(0.1, (now - started) / 8), 1.0, deadline - now))

    # -- teardown ------------------------------------------------------------
    def teardown(self, quiet=False):
        for warm in self.warm.values():
            warm.stop()
        for node in self.nodes.values():
            for proc in node.processes:
                proc.terminate()
            for proc in node.processes:
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    proc.kill()
            node.processes.clear()
        held = [netns for netns in [n.netns for n in self.nodes.values()] + [self.lan]
                if netns_exists(netns)]
        for pid in pids_in(held):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if held:
            ip_batch([["netns", "del", netns] for netns in held], check=False, keep_going=True)
        if not quiet:
            remove_tree(self.workdir)

    def __enter__(self):
        return self.build()

    def __exit__(self, *exc):
        self.teardown()

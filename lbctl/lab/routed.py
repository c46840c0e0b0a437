"""The lab of a mode ecmp cluster: the LAN of the balancers and workers, and an
upstream router with the clients behind it.

The router runs BIRD with a BGP session to every balancer, and installs each
VIP as one route with a next hop per balancer that offers it (ECMP).  The
kernel picks the next hop by a hash of the flow's addresses and ports
(fib_multipath_hash_policy 1), as an L3 switch upstream of a rack does.
Workers and balancers route the clients' network through it, so the
workers' direct-routed replies go back that way.
"""

import os
import time
from ipaddress import IPv4Network

from lbctl.adapters.programs import BIRD, BIRDC
from lbctl.errors import LabError
from lbctl.lab.topology import Lab
from lbctl.lab.shell import ip_batch, netns_exists, run

CLIENT_NETWORK = IPv4Network("10.99.0.0/24")
ROUTER_ON_CLIENTS = "10.99.0.1"
CLIENT = "10.99.0.2"


class RoutedLab(Lab):
    def __init__(self, cluster, cluster_file, prefix="ecmp"):
        if cluster.bgp is None:
            raise LabError(f"{cluster.source}: the routed lab needs a cluster of mode ecmp")
        super().__init__(cluster, cluster_file, prefix)
        # The client leaves the LAN for a network of its own behind the router,
        # which is wired first so the client can be plugged into it.
        client = self.nodes.pop("client")
        client.address = CLIENT
        self._add_node("router", "router", str(cluster.bgp.router))
        self.nodes["client"] = client

    def wire(self, name):
        if name == "client":
            self._wire_client()
            return
        super().wire(name)
        if name == "router":
            self._start_router_bird()

    def _wired_sysctls(self, name):
        wanted = super()._wired_sysctls(name)
        if name == "router":
            wanted["net.ipv4.ip_forward"] = "1"
            # The flow's ports in the hash, not only its addresses: one
            # client's connections spread over the balancers.
            wanted["net.ipv4.fib_multipath_hash_policy"] = "1"
        return wanted

    def _wired_routes(self, name):
        if name == "router":
            return []
        return [["route", "replace", str(CLIENT_NETWORK), "via", str(self.cluster.bgp.router)]]

    def _wire_client(self):
        client, router = self.nodes["client"], self.nodes["router"]
        if netns_exists(client.netns):
            run(["ip", "netns", "del", client.netns], check=False)
        ip_batch([["netns", "add", client.netns],
                  ["link", "add", "eth0", "netns", client.netns, "type", "veth",
                   "peer", "name", "eth1", "netns", router.netns]])
        prefix = CLIENT_NETWORK.prefixlen
        ip_batch([["address", "add", f"{ROUTER_ON_CLIENTS}/{prefix}", "dev", "eth1"],
                  ["link", "set", "eth1", "up"]], netns=router.netns)
        ip_batch([["address", "add", f"{CLIENT}/{prefix}", "dev", "eth0"],
                  ["link", "set", "eth0", "up"], ["link", "set", "lo", "up"],
                  ["route", "add", "default", "via", ROUTER_ON_CLIENTS]], netns=client.netns)

    # -- the router's BIRD ---------------------------------------------------
    def _router_path(self, name):
        return os.path.join(self.nodes["router"].root, name)

    def _start_router_bird(self):
        conf = self._router_path("bird.conf")
        with open(conf, "w") as fh:
            fh.write(render_router_bird(self.cluster, self._router_path("bird.log")))
        self.spawn("router", [BIRD, "-f", "-c", conf, "-s", self._router_path("bird.ctl"),
                              "-P", self._router_path("bird.pid")])

    def router_log(self, lines=30):
        """The end of the router's BIRD log: each session's state changes and
        their reasons, without the retries of a session still connecting."""
        try:
            with open(self._router_path("bird.log")) as fh:
                kept = [line for line in fh if "Connecting to" not in line
                        and "Connect delayed" not in line]
            return "".join(kept[-lines:])
        except OSError as exc:
            return f"(no log: {exc})"

    def birdc(self, *command):
        """What the router's BIRD answers to `birdc COMMAND`."""
        return self.sh("router", [BIRDC, "-s", self._router_path("bird.ctl"), *command],
                       check=False).stdout

    def next_hops(self, vip):
        """The balancer addresses the router's kernel sends `vip` to now."""
        return hops_in(self.sh("router", ["ip", "-4", "route", "show", f"{vip}/32"],
                               check=False).stdout)

    def wait_for_next_hops(self, vip, expected, timeout=30):
        """Seconds until the router's route for `vip` goes via `expected` (names)."""
        wanted = sorted(str(self.cluster.balancers[name].address) for name in expected)
        start = time.monotonic()
        self.wait_for(lambda: self.next_hops(vip) == wanted, timeout,
                      f"router's next hops for {vip} to be {wanted}")
        return time.monotonic() - start


def hops_in(route):
    """The next hops (sorted addresses) of a route as `ip route` prints it,
    a multipath one included, in either of its formats."""
    words = route.split()
    return sorted(words[i + 1] for i, word in enumerate(words) if word == "via")


def render_router_bird(cluster, log):
    """The router of the lab: a BGP session to each balancer, every route it
    learns into the kernel, equal ones merged into one multipath route."""
    bgp = cluster.bgp
    lines = [f"router id {bgp.router};",
             f'log "{log}" all;',
             # Each session's state changes and why ("BFD session down",
             # "Hold timer expired" are events), for a test that finds a
             # route missing.
             "debug protocols { states, events };",
             "protocol device {}",
             "protocol kernel {",
             "    ipv4 { import none; export all; };",
             f"    merge paths on limit {max(2, len(cluster.balancers))};",
             "}"]
    if bgp.bfd is not None:
        lines += ["protocol bfd {",
                  f"    interface \"eth0\" {{ interval {round(bgp.bfd.interval * 1000)} ms; "
                  f"multiplier {bgp.bfd.multiplier}; }};",
                  "}"]
    for name, balancer in cluster.balancers.items():
        lines += [f"protocol bgp {name} {{",
                  f"    local {bgp.router} as {bgp.router_as};",
                  f"    neighbor {balancer.address} as {bgp.local_as};",
                  f"    hold time {bgp.hold};",
                  f"    keepalive time {bgp.keepalive};",
                  "    connect retry time 2;",
                  "    error wait time 1, 5;",
                  *(["    bfd on;"] if bgp.bfd is not None else []),
                  "    ipv4 { import all; export none; };",
                  "}"]
    return "\n".join(lines) + "\n"

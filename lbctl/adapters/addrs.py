"""IPv4 addresses on interfaces, through iproute2's `ip`.

Why not pyroute2: on any import it loads its whole package (asyncio, NDB,
IPDB and every netlink family), 0.2 s on a PC and seconds on a Pi, for every
command that looks at an address.  `ip -json` reads the same rtnetlink dump
in one short exec, and `ip address add/del` make the same requests.  Every
word goes to `ip` as its own argument, never through a shell.
"""

import json
from ipaddress import IPv4Address

from lbctl.adapters.programs import IP, run


class AddressIp:
    def list(self):
        """[(IPv4Address, prefixlen, ifname)] of every IPv4 address on this host."""
        links = json.loads(self._run("-4", "-json", "address", "show") or "[]")
        return [(IPv4Address(a["local"]), a["prefixlen"], link["ifname"])
                for link in links for a in link.get("addr_info", [])
                if a.get("family") == "inet" and "local" in a]

    def add(self, address):
        self._run("-4", "address", "add", f"{address.ip}/{address.prefixlen}",
                  "dev", address.ifname)

    def remove(self, address):
        self._run("-4", "address", "del", f"{address.ip}/{address.prefixlen}",
                  "dev", address.ifname)

    def announce(self, addresses):
        from lbctl.adapters.garp import announce

        for ifname in sorted({a.ifname for a in addresses}):
            announce([a.ip for a in addresses if a.ifname == ifname], ifname)

    def holders(self, addresses):
        """{Address: MAC} of those of `addresses` another host on their LAN
        answers ARP for.  An interface that cannot send (down, or gone) is
        left out: no other host reaches it there either, and at boot a card
        that is late must not keep the VIPs away."""
        from lbctl.adapters.garp import holders

        held = {}
        for ifname in sorted({a.ifname for a in addresses}):
            mine = {a.ip: a for a in addresses if a.ifname == ifname}
            try:
                found = holders(list(mine), ifname)
            except OSError:
                continue
            held.update({mine[ip]: mac for ip, mac in found.items()})
        return held

    @staticmethod
    def _run(*args):
        done = run([IP, *args])
        if done.returncode != 0:
            # "RTNETLINK answers: File exists", "Cannot find device ...": as ip says it.
            raise OSError(done.stderr.strip().splitlines()[-1] if done.stderr.strip()
                          else f"ip {' '.join(args)} exited {done.returncode}")
        return done.stdout


def local_ipv4_addresses():
    """This host's IPv4 addresses, to find which node of the file it is."""
    return {ip for ip, _prefix, _ifname in AddressIp().list()}

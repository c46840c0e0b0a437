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

    def probe(self, addresses, listen):
        """Probed: which of `addresses` another host on their LAN answers ARP
        for.  An interface whose link is not up is not asked (its probes
        would go nowhere, and a silence would say nothing): it is named in
        `unasked`, so that at boot a card that is late keeps its VIPs."""
        from lbctl.adapters.garp import LINK_UP, holders, link_state
        from lbctl.adapters.protocols import Probed

        found = Probed()
        for ifname in sorted({a.ifname for a in addresses}):
            mine = {a.ip: a for a in addresses if a.ifname == ifname}
            if (state := link_state(ifname)) not in LINK_UP:
                found.unasked[ifname] = f"its link is {state}"
                continue
            try:
                heard = holders(list(mine), ifname, listen=listen)
            except OSError as exc:
                found.unasked[ifname] = exc.strerror or str(exc)
                continue
            found.held.update({mine[ip]: mac for ip, mac in heard.items()})
        return found

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

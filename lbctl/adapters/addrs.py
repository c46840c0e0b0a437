"""IPv4 addresses on interfaces, over rtnetlink with pyroute2."""

from ipaddress import IPv4Address
from socket import AF_INET


class AddressNetlink:
    def __init__(self):
        from pyroute2 import IPRoute  # heavy; only commands that touch the kernel load it

        self._ipr = IPRoute()

    def list(self):
        names = {link["index"]: link.get_attr("IFLA_IFNAME") for link in self._ipr.get_links()}
        return [(IPv4Address(a.get_attr("IFA_ADDRESS") or a.get_attr("IFA_LOCAL")),
                 a["prefixlen"], names.get(a["index"], "?"))
                for a in self._ipr.get_addr(family=AF_INET)]

    def _index(self, ifname):
        found = self._ipr.link_lookup(ifname=ifname)
        if not found:
            raise LookupError(f"no interface named {ifname}")
        return found[0]

    def add(self, address):
        self._ipr.addr("add", index=self._index(address.ifname), address=str(address.ip),
                       prefixlen=address.prefixlen)

    def remove(self, address):
        self._ipr.addr("del", index=self._index(address.ifname), address=str(address.ip),
                       prefixlen=address.prefixlen)

    def close(self):
        self._ipr.close()


def local_ipv4_addresses():
    """This host's IPv4 addresses, read without pyroute2 so node lookup stays cheap."""
    import subprocess

    out = subprocess.run(["ip", "-4", "-o", "address", "show"], capture_output=True,
                         text=True, check=False).stdout
    found = set()
    for line in out.splitlines():
        fields = line.split()
        if "inet" in fields:
            found.add(IPv4Address(fields[fields.index("inet") + 1].split("/")[0]))
    return found

"""How lbctl reaches and is read on the nodes: the ssh section (--all) and
the exporter's listen address."""

import re
from ipaddress import IPv4Address

from lbctl.config.model import DEFAULT_EXPORTER_LISTEN, Ssh, split_listen

SSH_KEYS = {"user", "port", "sudo", "hosts"}

# What ssh takes as a login and a host: never an option (a leading '-') or
# anything a shell or ssh_config would read twice.
SSH_USER_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}")

SSH_HOST_RE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?")


def check_ssh(c, value, balancers, workers):
    """How `--all` reaches each node (see model.Ssh)."""
    p = ("ssh",)
    if c.mapping(value, p, SSH_KEYS) is None:
        return Ssh()
    user = value.get("user")
    if user is not None and (not isinstance(user, str) or not SSH_USER_RE.fullmatch(user)):
        c.error(p + ("user",), f"ssh.user: {user!r} is not a login name (letters, digits, "
                "'_', '.', '-', starting with a letter or '_')")
        user = None
    port = c.integer(value["port"], p + ("port",), 1, 65535, "port") if "port" in value else None
    sudo = c.boolean(value["sudo"], p + ("sudo",)) if "sudo" in value else None
    hosts = {}
    if "hosts" in value:
        ph = p + ("hosts",)
        spec = c.mapping(value["hosts"], ph, set(balancers) | set(workers))
        for node, host in (spec or {}).items():
            if node not in balancers and node not in workers:
                continue  # reported as an unknown key
            if not isinstance(host, str) or not SSH_HOST_RE.fullmatch(host):
                c.error(ph + (node,), f"ssh.hosts.{node}: {host!r} is not a host name or "
                        "address (letters, digits, '.', '-')")
                continue
            hosts[node] = host
    return Ssh(user, port, sudo, hosts)


def check_exporter(c, value, balancers, vips=()):
    """(listen, public) from `exporter: {listen: ADDRESS:PORT, public: BOOL}`: each
    balancer runs `lbctl exporter` there;
    ADDRESS `node` is each balancer's own address from the file.  Every
    address (0.0.0.0) or a VIP takes `public: true`: metrics nobody
    authenticates, served to whoever reaches the VIP (in mode ecmp the
    router delivers VIP:PORT from anywhere)."""
    p = ("exporter",)
    if value is None:
        value = {}  # `exporter:` alone: the defaults
    if c.mapping(value, p, {"listen", "public"}) is None:
        return None, False
    public = c.boolean(value.get("public", False), p + ("public",))
    listen = value.get("listen", DEFAULT_EXPORTER_LISTEN)
    text = listen if isinstance(listen, str) else ""
    try:
        address, _ = split_listen(text.replace("node:", "127.0.0.1:", 1)
                                  if text.startswith("node:") else text)
    except ValueError:
        c.error(p + ("listen",), f"exporter.listen: {listen!r} is not ADDRESS:PORT (an IPv4 "
                "address to bind, 127.0.0.1 for this host only or `node` for each balancer's "
                "own, and a port from 1 to 65535)")
        return None, False
    wide = "every address of the balancer" if address == IPv4Address("0.0.0.0") else \
        "a VIP" if address in set(vips) else None
    if wide and not public:
        c.error(p + ("listen",), f"exporter.listen: {listen!r} serves the metrics on {wide}, "
                "to anyone who reaches it (in mode ecmp the router delivers the VIPs from "
                "anywhere): use node:PORT for the LAN, or add `public: true` to say so")
        return None, False
    shared = {IPv4Address("127.0.0.1"), IPv4Address("0.0.0.0")}
    if len(balancers) > 1 and not text.startswith("node:") and address not in shared:
        c.error(p + ("listen",), f"exporter.listen: {listen!r} names one address, and each "
                "balancer of the pair binds its own: use node:PORT")
        return None, False
    return text, bool(public)

"""IPVS over generic netlink.

Reading uses pyroute2.  Writing packs requests with ipvs_wire and sends them
in batches on one socket (see run()), which is what keeps 1000 services x 10
real servers close to ipvsadm-restore.
"""

import asyncio
import os
import socket
from ipaddress import IPv4Address

from lbctl.adapters import ipvs_wire
from lbctl.adapters.protocols import IpvsDest, IpvsService, IpvsStats, OpResult
from lbctl.config.model import ServiceKey

PROTOCOLS = {"tcp": socket.IPPROTO_TCP, "udp": socket.IPPROTO_UDP}
PROTOCOL_NAMES = {v: k for k, v in PROTOCOLS.items()}
IP_VS_SVC_F_PERSISTENT = 0x0001


def _stats(nla):
    if nla is None:
        return IpvsStats()
    get = nla.get_attr
    return IpvsStats(get("IPVS_STATS_ATTR_CONNS") or 0, get("IPVS_STATS_ATTR_INPKTS") or 0,
                     get("IPVS_STATS_ATTR_OUTPKTS") or 0, get("IPVS_STATS_ATTR_INBYTES") or 0,
                     get("IPVS_STATS_ATTR_OUTBYTES") or 0, get("IPVS_STATS_ATTR_CPS") or 0,
                     get("IPVS_STATS_ATTR_INBPS") or 0, get("IPVS_STATS_ATTR_OUTBPS") or 0)


class IpvsNetlink:
    def __init__(self):
        # pyroute2 is imported here, not at module level: it costs a Pi most of
        # a second and only the commands that talk to the kernel need it.
        from pyroute2 import ipvs as pyroute2_ipvs

        self._lib = pyroute2_ipvs

    # -- reading -----------------------------------------------------------
    def dump(self):
        return asyncio.run(self._dump())

    async def _dump(self):
        lib = self._lib
        async with lib.AsyncIPVS() as sock:
            await sock.setup_endpoint()
            services = []
            for msg in await sock.service("dump"):
                nla = msg.get_attr("IPVS_CMD_ATTR_SERVICE")
                services.append((nla, lib.IPVSService.from_message(msg)))
            result = []
            for nla, handle in services:
                dests = []
                for msg in await sock.dest("dump", service=handle):
                    d = msg.get_attr("IPVS_CMD_ATTR_DEST")
                    dests.append(IpvsDest(
                        IPv4Address(d.get_attr("IPVS_DEST_ATTR_ADDR")),
                        d.get_attr("IPVS_DEST_ATTR_PORT"),
                        d.get_attr("IPVS_DEST_ATTR_WEIGHT"),
                        d.get_attr("IPVS_DEST_ATTR_FWD_METHOD") & 0x7,
                        d.get_attr("IPVS_DEST_ATTR_ACTIVE_CONNS") or 0,
                        d.get_attr("IPVS_DEST_ATTR_INACT_CONNS") or 0,
                        _stats(d.get_attr("IPVS_DEST_ATTR_STATS64") or d.get_attr("IPVS_DEST_ATTR_STATS"))))
                result.append(self._service(nla, dests))
            return result

    def _service(self, nla, dests):
        get = nla.get_attr
        fwmark = get("IPVS_SVC_ATTR_FWMARK")
        flags = (get("IPVS_SVC_ATTR_FLAGS") or {}).get("flags", 0)
        persistence = get("IPVS_SVC_ATTR_TIMEOUT") if flags & IP_VS_SVC_F_PERSISTENT else 0
        stats = _stats(get("IPVS_SVC_ATTR_STATS64") or get("IPVS_SVC_ATTR_STATS"))
        proto = PROTOCOL_NAMES.get(get("IPVS_SVC_ATTR_PROTOCOL"))
        addr = get("IPVS_SVC_ATTR_ADDR")
        if fwmark or proto is None or get("IPVS_SVC_ATTR_AF") != socket.AF_INET:
            label = f"fwmark {fwmark}" if fwmark else f"proto {get('IPVS_SVC_ATTR_PROTOCOL')} {addr}"
            return IpvsService(None, label, get("IPVS_SVC_ATTR_SCHED_NAME"), persistence,
                               tuple(dests), stats)
        key = ServiceKey(proto, IPv4Address(addr), get("IPVS_SVC_ATTR_PORT"))
        return IpvsService(key, str(key), get("IPVS_SVC_ATTR_SCHED_NAME"), persistence,
                           tuple(dests), stats)

    # -- writing -----------------------------------------------------------
    def run(self, ops):
        """Send every op, batched; one OpResult per op, in order.

        Requests go out hundreds to a sendmsg() on one socket and their acks
        are read back after each batch, instead of a round trip each.  Service
        ops are all answered before any real-server op is sent, so a real
        server never races the service it belongs to.
        """
        results = [OpResult(op) for op in ops]
        sock = ipvs_wire.GenlSocket()
        try:
            family = sock.family("IPVS")
            for target in ("service", "dest"):
                batch = [r for r in results if r.op.target == target]
                builders = [lambda seq, op=r.op: ipvs_wire.op_message(family, seq, op) for r in batch]
                for result, code in zip(batch, sock.request_all(builders)):
                    if code:
                        result.errno = code
                        result.error = OSError(code, os.strerror(code))
        finally:
            sock.close()
        return results

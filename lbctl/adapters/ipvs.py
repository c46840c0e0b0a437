"""IPVS over generic netlink, with pyroute2.

Changes are pipelined: all requests of a phase are in flight on one socket at
once (bounded, so acks never overrun the socket buffer) instead of paying a
round trip each, which is what keeps 1000 services x 10 real servers fast.
"""

import asyncio
import errno as errno_codes
import socket
from ipaddress import IPv4Address

from lbctl.adapters.protocols import IpvsDest, IpvsService, IpvsStats, OpResult
from lbctl.config.model import ServiceKey

PROTOCOLS = {"tcp": socket.IPPROTO_TCP, "udp": socket.IPPROTO_UDP}
PROTOCOL_NAMES = {v: k for k, v in PROTOCOLS.items()}
IP_VS_SVC_F_PERSISTENT = 0x0001
IN_FLIGHT = 256


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
        """Send every op, pipelined; one OpResult per op, in order.

        Service ops are all answered before any real-server op is sent, so a
        real server never races the service it belongs to.
        """
        return asyncio.run(self._run(ops))

    async def _run(self, ops):
        results = [OpResult(op) for op in ops]
        async with self._lib.AsyncIPVS() as sock:
            await sock.setup_endpoint()
            gate = asyncio.Semaphore(IN_FLIGHT)
            for target in ("service", "dest"):
                batch = [r for r in results if r.op.target == target]
                await asyncio.gather(*(self._send(sock, gate, r) for r in batch))
        return results

    async def _send(self, sock, gate, result):
        op = result.op
        async with gate:
            try:
                if op.target == "service":
                    await sock.service(op.verb, service=self._service_handle(op.service, op.spec))
                else:
                    await sock.dest(op.verb, service=self._service_handle(op.service),
                                    dest=self._dest_handle(op.dest, op.spec))
            except Exception as exc:  # recorded per op; the executor reports it by name
                result.error = exc
                result.errno = getattr(exc, "code", 0) or errno_codes.EIO

    def _service_handle(self, key, spec=None):
        fields = {"protocol": PROTOCOLS[key.protocol], "addr": str(key.vip), "port": key.port}
        if spec is not None:
            fields["sched_name"] = spec.scheduler
            if spec.persistence:
                fields["flags"] = {"flags": IP_VS_SVC_F_PERSISTENT, "mask": 0xFFFF}
                fields["timeout"] = spec.persistence
            else:
                fields["flags"] = {"flags": 0, "mask": 0xFFFF}
                fields["timeout"] = 0
        return self._lib.IPVSService(**fields)

    def _dest_handle(self, key, spec=None):
        fields = {"addr": str(key.address), "port": key.port}
        if spec is not None:
            fields["weight"] = spec.weight
            fields["fwd_method"] = spec.forward
        return self._lib.IPVSDest(**fields)

"""IPVS timeouts, one-packet scheduling and scheduler flags, as the kernel applies
them: set by lbctl on the netlink engine and by keepalived on its own."""

import re
import sys

from clusters import DNS_VIP, WEB_VIP, edited

# One UDP socket, so one client port: without one-packet scheduling IPVS keeps
# a connection entry for the flow and every datagram goes to the same worker.
ONE_SOCKET = ("import socket,sys\n"
              "s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM); s.settimeout(2)\n"
              "for _ in range(int(sys.argv[3])):\n"
              " s.sendto(b'who', (sys.argv[1], int(sys.argv[2])))\n"
              " try: print(s.recv(2048).decode().strip())\n"
              " except OSError: print('timeout')\n")


def _one_socket_answers(lab, count):
    return lab.sh("client", [sys.executable, "-c", ONE_SOCKET, DNS_VIP, "53", str(count)]
                  ).stdout.split("\n")[:-1]


def _kernel_timeouts(lab, node="lb1"):
    out = lab.sh(node, ["ipvsadm", "-L", "--timeout"]).stdout
    return tuple(int(n) for n in re.search(r"Timeout \(tcp tcpfin udp\): (\d+) (\d+) (\d+)",
                                           out).groups())


def _service_line(lab, proto, vip, port, node="lb1"):
    out = lab.sh(node, ["ipvsadm", "-Ln", f"--{proto}-service", f"{vip}:{port}"]).stdout
    return next(line for line in out.splitlines() if f"{vip}:{port}" in line)


def _apply(lab, path):
    result = lab.lbctl("lb1", "apply", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def _dns(**settings):
    return lambda services: {**services, "dns": {**services["dns"], **settings}}


def test_timeouts_one_packet_and_scheduler_flags_reach_ipvs(lab, base):
    before = _kernel_timeouts(lab)
    try:
        # One client socket: a flow, so one worker answers it all.
        assert len(set(_one_socket_answers(lab, 6))) == 1

        ops = lab.write("ops", edited(ipvs={"timeouts": {"tcp": 600, "udp": 20}},
                                      services=_dns(one_packet=True)))
        out = _apply(lab, ops)
        assert "ipvs timeout udp = 20s" in out
        assert _kernel_timeouts(lab) == (600, before[1], 20)  # tcp_fin: not in the file
        assert " ops" in _service_line(lab, "udp", DNS_VIP, 53)
        # Each datagram is scheduled on its own: round robin over pi1 and pi2.
        assert set(_one_socket_answers(lab, 6)) == {"served by pi1", "served by pi2"}

        # sh hashes the client's address alone: every query from the one
        # client lands on one worker.  With sh-port the client's port counts too.
        # This file sets no timeouts any more: the kernel gets its own back.
        sh = lab.write("sh", edited(services=_dns(scheduler="sh", one_packet=True)))
        out = _apply(lab, sh)
        assert _kernel_timeouts(lab) == before, out
        assert len(set(lab.udp_ask(DNS_VIP, 53, count=8))) == 1
        sh_port = lab.write("sh-port", edited(services=_dns(
            scheduler="sh", one_packet=True, scheduler_flags=["sh-port", "sh-fallback"])))
        out = _apply(lab, sh_port)
        assert "flags ops,sh-fallback,sh-port" in out
        line = _service_line(lab, "udp", DNS_VIP, 53)
        assert "sh-port" in line and "sh-fallback" in line and " ops" in line
        assert set(lab.udp_ask(DNS_VIP, 53, count=16)) == {"served by pi1", "served by pi2"}
        # The flags read back as written: nothing left to change.
        plan = lab.lbctl("lb1", "plan", str(sh_port), "--detailed-exitcode")
        assert plan.returncode == 0, plan.stdout + plan.stderr

        # Under keepalived (a health check), its lvs_timeouts and flag keywords
        # set the same; apply waits for them and names any that are missing.
        checked = lab.write("keepalived-settings", edited(
            ipvs={"timeouts": {"tcp": 700}},
            services=lambda s: {**s, "web": {**s["web"], "scheduler": "sh",
                                             "scheduler_flags": ["sh-port"],
                                             "health": {"tcp": {}, "rise": 1}}}))
        out = _apply(lab, checked)
        assert "IPVS matches the file" in out
        assert _kernel_timeouts(lab)[0] == 700
        assert "sh-port" in _service_line(lab, "tcp", WEB_VIP, 80)
    finally:
        lab.reset()
        lab.sh("lb1", ["ipvsadm", "--set", *map(str, before)])

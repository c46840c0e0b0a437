"""`lbctl plan` at 1000 services x 10 real servers outside the lab VM, against a saved dump.

The lab VM emulates its CPU, which inflates every figure of
bench/ipvs_apply.py several times over.  What an apply or a plan does
besides talking to the kernel needs no IPVS, so it is measured here on
the machine itself: the whole `lbctl plan` command, run as a user runs it
in a network namespace of its own (where the balancer's address is), with
only the kernel's replies to its dump taken from bytes laid out as Linux
6.1's ip_vs_ctl.c lays them out, and sent back through a socket of this
script's that frames them as the kernel does: lbctl's reads, framing and
decoding all run on them.  The table is as uniform as
ipvs_apply.py's (one VIP, the same ten workers in every service).  bench/breakdown.py's clocks give the parts, against a bare
`python3 -c pass` measured in the same run:

    python bench/offline_plan.py [--services 1000] [--reals 10] [--runs 3]

It prints a Markdown table; each figure is the best of --runs.
"""

import io
import json
import os
import struct
import sys
import time
from contextlib import redirect_stdout
from pathlib import Path

# Only what a measured run needs is imported up here: whatever this script
# imports first, lbctl's imports would find made already.

HERE = Path(__file__).resolve().parent
FAMILY = 0x7F  # the id the saved replies answer to
INSIDE = "--inside"
REPLIES = "saved replies, made"


def nla(kind, payload):
    from lbctl.adapters.ipvs_wire import nla as packed

    return packed(kind, payload)


def _stats(width):
    """A stats block as ip_vs_genl_fill_stats (u32 counters, u64 bytes) or
    its 64-bit twin writes it."""
    code = {32: "=I", 64: "=Q"}[width]
    fields = []
    for kind in range(1, 11):
        wide = width == 64 or kind in (4, 5)  # in and out bytes are always u64
        fields.append(nla(kind, struct.pack("=Q" if wide else code, 7)))
    return b"".join(fields)


def service_payload(vip, port):
    from lbctl.adapters import ipvs_wire as w

    body = (nla(w.SVC_AF, struct.pack("=H", 2)) + nla(w.SVC_PROTOCOL, struct.pack("=H", 6))
            + nla(w.SVC_ADDR, vip.packed + bytes(12)) + nla(w.SVC_PORT, struct.pack("!H", port))
            + nla(w.SVC_SCHED_NAME, b"rr\0") + nla(w.SVC_FLAGS, struct.pack("=II", 2, 0xFFFFFFFF))
            + nla(w.SVC_TIMEOUT, struct.pack("=I", 0))
            + nla(w.SVC_NETMASK, struct.pack("=I", 0xFFFFFFFF))
            + nla(w.SVC_STATS, _stats(32)) + nla(w.SVC_STATS64, _stats(64)))
    return struct.pack("=BBH", 4, 1, 0) + nla(w.IPVS_CMD_ATTR_SERVICE, body)


def dest_payload(address, port):
    from lbctl.adapters import ipvs_wire as w

    u32 = lambda v: struct.pack("=I", v)  # noqa: E731
    body = (nla(w.DEST_ADDR, address.packed + bytes(12)) + nla(w.DEST_PORT, struct.pack("!H", port))
            + nla(w.DEST_FWD_METHOD, u32(3)) + nla(w.DEST_WEIGHT, u32(1))
            + nla(13, b"\0") + nla(14, b"\0\0") + nla(15, b"\0\0")  # tunnel type, port, flags
            + nla(w.DEST_U_THRESH, u32(0)) + nla(w.DEST_L_THRESH, u32(0))
            + nla(w.DEST_ACTIVE_CONNS, u32(0)) + nla(w.DEST_INACT_CONNS, u32(0))
            + nla(9, u32(0))  # persistent connections
            + nla(w.DEST_ADDR_FAMILY, struct.pack("=H", 2))
            + nla(w.DEST_STATS, _stats(32)) + nla(w.DEST_STATS64, _stats(64)))
    return struct.pack("=BBH", 8, 1, 0) + nla(w.IPVS_CMD_ATTR_DEST, body)


def replay_saved_dump(spec):
    """Make GenlSocket answer IPVS's family and dumps from saved replies."""
    from ipaddress import IPv4Address

    from lbctl.adapters import ipvs_wire as w

    services, dests = [], {}
    for svc in spec["services"].values():
        payload = service_payload(IPv4Address(svc["vip"]), svc["port"])
        services.append(payload)
        # Asked for as ipvs_table() asks: by the key attributes the dump gave.
        key = w.parse_service(w._top_attr(payload, w.IPVS_CMD_ATTR_SERVICE))["key"]
        dests[w.nla(w.IPVS_CMD_ATTR_SERVICE, key)] = [
            dest_payload(IPv4Address(worker["address"]), svc["port"])
            for worker in spec["workers"].values()]
    real_family, real_init = w.GenlSocket.family, w.GenlSocket.__init__

    def family(self, name):
        return FAMILY if name == "IPVS" else real_family(self, name)

    def init(self):
        real_init(self)
        self.sock.close()
        self.sock = SavedKernel(services, dests)

    w.GenlSocket.family, w.GenlSocket.__init__ = family, init


class SavedKernel:
    """A socket that answers IPVS's dump requests with saved replies, framed
    as the kernel frames them: netlink messages of the request's sequence
    number, packed into datagrams of at most 32 KiB, then NLMSG_DONE.
    lbctl's reads, framing and decoding all run on them."""

    DATAGRAM = 32 << 10

    def __init__(self, services, dests):
        from collections import deque

        self.services, self.dests, self.queue = services, dests, deque()

    def send(self, data):
        from lbctl.adapters import ipvs_wire as w

        _length, _kind, _flags, seq, _pid = struct.unpack_from("=IHHII", data)
        command, attrs = data[16], data[20:]
        replies = self.services if command == w.IPVS_CMD_GET_SERVICE else self.dests[attrs]
        datagram = b""
        for payload in replies:
            message = struct.pack("=IHHII", 16 + len(payload), FAMILY, 0x2, seq, 0) + payload
            message += bytes(-len(message) % 4)
            if len(datagram) + len(message) > self.DATAGRAM:
                self.queue.append(datagram)
                datagram = b""
            datagram += message
        if datagram:
            self.queue.append(datagram)
        self.queue.append(struct.pack("=IHHIIi", 20, w.NLMSG_DONE, 0x2, seq, 0, 0))
        return len(data)

    def recvmsg(self, size):
        return self.queue.popleft(), [], 0, None

    def close(self):
        pass


def inside(args):
    """In the namespace: the address plan looks for, then each measured run."""
    import atexit
    import re
    import shutil
    import subprocess
    import tempfile

    import yaml

    from breakdown import imported_modules
    from ipvs_apply import BALANCER, cluster_spec

    subprocess.run(["ip", "link", "add", "bench0", "type", "veth", "peer", "name", "bench1"], check=True)
    subprocess.run(["ip", "address", "add", f"{BALANCER}/16", "dev", "bench0"], check=True)
    subprocess.run(["ip", "link", "set", "bench0", "up"], check=True)
    spec = cluster_spec(args.services, args.reals)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        path, saved = tmp / "cluster.yaml", tmp / "cluster.json"
        path.write_text(yaml.safe_dump(spec, sort_keys=False))
        saved.write_text(json.dumps(spec))
        (tmp / "root").mkdir()
        argv = ["plan", str(path), "--node", "lb", "--root", str(tmp / "root")]
        modules = tmp / "imports"
        # The saved dump must read back as the file's own table, or the plan
        # measured would be one of adds.
        check = subprocess.run([sys.executable, str(__file__), "--replay", str(saved), "--",
                                *argv], capture_output=True, text=True)
        ipvs_changes = re.findall(r"^\s*\S+ (?:service|real server) .*$", check.stdout, re.M)
        if check.returncode != 0 or ipvs_changes:
            sys.exit(f"bench: the saved dump did not read back as the file's table: "
                     f"{check.stdout[-2000:]}{check.stderr[-2000:]}")
        found = {}
        # lbctl keeps no cache where others could write above it, as in /tmp.
        caches = Path(tempfile.mkdtemp(dir=Path.home()))
        atexit.register(shutil.rmtree, caches, ignore_errors=True)
        for label, cache in (("plan, a file not seen before", None),
                             ("plan, the same file again", caches / "kept")):
            runs = []
            for _ in range(args.runs):
                def env():  # a file not seen before: each run with a cache of its own
                    return dict(os.environ,
                                XDG_CACHE_HOME=str(cache or tempfile.mkdtemp(dir=caches)))

                done = subprocess.run([sys.executable, "-X", "importtime", str(__file__),
                                       "--replay", str(saved), "--", *argv],
                                      env=env(), capture_output=True, text=True)
                if done.returncode != 0:
                    sys.exit(f"bench: plan failed: {done.stderr[-2000:]}")
                names, import_sum = imported_modules(done.stderr)
                modules.write_text("\n".join(names))
                start = time.perf_counter()
                measured = subprocess.run([sys.executable, str(__file__), "--replay", str(saved),
                                           "--imports", str(modules), "--", *argv],
                                          env=env(), capture_output=True, text=True)
                whole = time.perf_counter() - start
                if measured.returncode != 0:
                    sys.exit(f"bench: plan failed: {measured.stderr[-2000:]}")
                parts = json.loads(measured.stdout.splitlines()[-1])
                whole -= parts.pop(REPLIES)
                runs.append({"interpreter start": whole - sum(parts.values()), **parts,
                             "the whole command": whole,
                             "-X importtime, its imports": import_sum})
            found[label] = min(runs, key=lambda r: r["the whole command"])
        bare = min(_timed([sys.executable, "-c", "pass"]) for _ in range(args.runs))
    from report import machine, section

    text = (f"### The same plan outside the VM, against a saved dump\n\n"
            f"`bench/offline_plan.py`, {machine()}.  `lbctl plan` of the {args.services} x "
            f"{args.reals} file, run as a user runs it in a network namespace of its own, "
            "with the kernel's replies to its dump taken from bytes laid out as Linux 6.1 "
            "lays them out (this machine's kernel has no IPVS), handed to lbctl's decoder "
            "through a socket that frames them as the kernel does, so that lbctl's reads, "
            "framing and decoding all run (the round trips' row holds the socket's framing "
            "too).  Each column is the quickest of "
            f"{args.runs} runs.  Seconds:\n\n" + table(found, bare, args))
    print(section("bench/offline_plan.py", text))


def _timed(argv):
    import subprocess

    start = time.perf_counter()
    subprocess.run(argv, check=True)
    return time.perf_counter() - start


def table(found, bare, args):
    from breakdown import ordered_rows

    labels = list(found)
    lines = ["| part | " + " | ".join(labels) + " |", "| --- |" + " --- |" * len(labels)]
    shown = {"kernel dump: netlink round trips": "kernel dump: the saved replies, framed and read"}
    for part in ordered_rows(found):
        lines.append(f"| {shown.get(part, part)} | " + " | ".join(
            f"{found[label][part]:.3f}" if part in found[label] else "" for label in labels) + " |")
    lines.append("| python3 -c pass, for comparison | " + " | ".join(f"{bare:.3f}" for _ in labels)
                 + " |")
    lines.append("")
    for label in labels:
        whole = found[label]["the whole command"]
        lines.append(f"- {label}: {whole:.3f} s, {whole / bare:.1f}x a bare Python start; "
                     f"its imports and the interpreter's start "
                     f"{(found[label]['imports'] + found[label]['interpreter start']) / bare:.1f}x "
                     "alone.")
    return "\n".join(lines)


def measured_run():
    """One plan in this process, answering from saved replies (--replay)."""
    split = sys.argv.index("--")
    path = sys.argv[sys.argv.index("--replay") + 1]
    with open(path) as fh:
        spec = json.load(fh)
    if "--imports" in sys.argv[:split]:
        # bench/breakdown.py's run, with its argv as it expects it.
        imports = sys.argv[sys.argv.index("--imports") + 1]
        sys.argv = [sys.argv[0], imports, *sys.argv[split:]]
        import breakdown

        original = breakdown.install

        made = {}

        def install(clocks):
            start = time.perf_counter()
            replay_saved_dump(spec)  # first, so the clocks time the replies as round trips
            made[REPLIES] = time.perf_counter() - start
            original(clocks)

        breakdown.install = install
        printed = io.StringIO()
        with redirect_stdout(printed):
            breakdown.main()
        # Making the replies is this benchmark's work, not lbctl's: the caller takes it out.
        print(json.dumps(json.loads(printed.getvalue().splitlines()[-1]) | made))
        return
    replay_saved_dump(spec)
    from lbctl.cli import main

    sys.exit(main(sys.argv[split + 1:]))


def main():
    if "--replay" in sys.argv:
        return measured_run()
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--services", type=int, default=1000)
    parser.add_argument("--reals", type=int, default=10)
    parser.add_argument("--runs", type=int, default=3, help="best of this many (default 3)")
    parser.add_argument(INSIDE, action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not args.inside:
        os.execvp("unshare", ["unshare", "--net", "--", sys.executable, os.path.abspath(__file__),
                              *sys.argv[1:], INSIDE])
    inside(args)


if __name__ == "__main__":
    main()

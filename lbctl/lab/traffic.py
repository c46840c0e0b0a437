"""Lab clients that measure: a steady request stream, and slow long downloads.

Run inside the client's namespace (`python -m lbctl.lab.traffic ...`); each
prints one JSON document when done, so a test or the demo can read what a
user would have seen: which requests failed, how long the VIP was silent,
whether every download arrived byte for byte.
"""

import argparse
import hashlib
import json
import selectors
import signal
import socket
import sys
import time


REQUEST_STEP = "request from port "
# On stderr, once a client is under way and its signal handlers are in place:
# on a busy machine the interpreter's start can take seconds, and a signal
# that came sooner would kill the client.  LabTopology.traffic waits for it.
STARTED = "traffic: started"


def _get(address, port, path, timeout):
    """One HTTP/1.0 request on a new connection: (ok, the body, or what went wrong).
    A failure names its step (connect, or the request on a connection from
    its client port), so a test can look the connection up in IPVS tables
    (failed_client_port)."""
    step = "connect"
    try:
        with socket.create_connection((address, port), timeout=timeout) as sock:
            step = f"{REQUEST_STEP}{sock.getsockname()[1]}"
            sock.settimeout(timeout)
            sock.sendall(_request(address, path))
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
    except OSError as exc:
        # What the client saw, for a test that finds a failed request to say why.
        return False, f"error: {step}: {type(exc).__name__}: {exc}"
    return _answer(data)


def failed_client_port(body):
    """The client port a failed request's body names, or None (it failed to connect)."""
    _, found, rest = body.partition(REQUEST_STEP)
    return int(rest.split(":", 1)[0]) if found else None


def _request(address, path):
    """One HTTP/1.0 GET: the server closes the connection when it has answered."""
    return f"GET {path} HTTP/1.0\r\nHost: {address}\r\n\r\n".encode()


def _answer(data):
    """(ok, the body, or what went wrong) of a whole HTTP response."""
    head, _, body = data.partition(b"\r\n\r\n")
    status = head.split(b"\r\n", 1)[0]
    if not (head.startswith(b"HTTP/1.") and b" 200 " in status):
        return False, f"error: answered {status.decode(errors='replace')!r}"
    return True, body.decode(errors="replace").strip()


def steady_load(address, port, seconds, interval, timeout, path="/"):
    """A request every `interval` for `seconds`: [(start, end, ok, body)].
    SIGINT ends it early, once the request in flight has ended: a request
    stalled at that moment is still counted, as it ends."""
    stopping = []
    signal.signal(signal.SIGINT, lambda _signum, _frame: stopping.append(True))
    print(STARTED, file=sys.stderr, flush=True)
    records = []
    end = time.time() + seconds
    next_start = time.time()
    while next_start < end and not stopping:
        time.sleep(max(0.0, next_start - time.time()))
        if stopping:
            break
        start = time.time()
        ok, body = _get(address, port, path, timeout)
        records.append((start, time.time(), ok, body))
        next_start = max(next_start + interval, time.time())
    _ignore_from_now_on(signal.SIGINT)
    return records


def _ignore_from_now_on(signum):
    """A stop or hurry that comes as the client ends must not kill it: the
    interpreter's exit puts a signal Python handled back to its default
    action (for SIGINT and SIGUSR1: the end of the process, and its report
    with it), but leaves one it ignores ignored."""
    signal.signal(signum, signal.SIG_IGN)


def probes(address, port, seconds, interval, timeout, path="/", retries=0, retry_delay=1.0):
    """A request every `interval` for `seconds`, each on a connection of its
    own and none waiting for those before it: [(start, end, ok, body)].

    steady_load sends the next request only once the last one has ended, so
    through an outage it asks once per timeout.  Here a fresh SYN leaves
    every `interval` whatever happened to the others, so the first request
    the VIP's new holder answers comes within `interval` of its taking over.

    Each attempt is given `timeout` s; one that fails is made again
    `retry_delay` s later, up to `retries` times, as `curl --retry` does.
    Within an attempt the kernel resends an unanswered SYN after 1 s, as
    for any client.  A record spans every attempt of its request.
    """
    import asyncio

    records = []

    async def get():
        reader, writer = await asyncio.open_connection(address, port)
        try:
            writer.write(_request(address, path))
            return await reader.read()
        finally:
            writer.close()

    async def attempt():
        start = time.time()
        for tried in range(retries + 1):
            if tried:
                await asyncio.sleep(retry_delay)
            try:
                ok, body = _answer(await asyncio.wait_for(get(), timeout))
            except (OSError, asyncio.TimeoutError) as exc:
                ok, body = False, f"error: {type(exc).__name__}: {exc}"
            if ok:
                break
        records.append((start, time.time(), ok, body))

    async def stream():
        attempts, next_start, end = [], time.time(), time.time() + seconds
        print(STARTED, file=sys.stderr, flush=True)
        while next_start < end:
            await asyncio.sleep(max(0.0, next_start - time.time()))
            attempts.append(asyncio.create_task(attempt()))
            next_start += interval
        await asyncio.gather(*attempts)

    asyncio.run(stream())
    return sorted(records)


def slow_downloads(address, port, count, path, rate, rcvbuf=16384, timeout=120):
    """`count` downloads at once, each read at about `rate` bytes/s.

    A small receive buffer keeps the sender paced by the reader, so each
    connection stays in flight on the wire (and through the balancer's
    connection table) for the whole download.  SIGUSR1 lifts the pace: the
    downloads then finish as fast as the path allows.  A test starts them slow
    enough to outlast its steps on the slowest machine, and hurries them once
    its steps are done, so it waits no longer than it must.
    Returns [{"ok", "bytes", "sha256", "error"}].
    """
    pace = {"per_tick": max(1, int(rate / 20)), "pause": 0.05}

    def hurry(_signum, _frame):
        pace.update(per_tick=1 << 20, pause=0)

    signal.signal(signal.SIGUSR1, hurry)
    sel = selectors.DefaultSelector()
    results = []
    for _ in range(count):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.settimeout(10)
        state = {"data": bytearray(), "error": None, "done": False}
        try:
            sock.connect((address, port))
            sock.sendall(_request(address, path))
            sock.setblocking(False)
            sel.register(sock, selectors.EVENT_READ, state)
        except OSError as exc:
            state["error"], state["done"] = f"connect: {exc}", True
        results.append(state)
    print(STARTED, file=sys.stderr, flush=True)  # every download has asked
    deadline = time.time() + timeout
    while sel.get_map() and time.time() < deadline:
        for key, _ in sel.select(timeout=0.05):
            state = key.data
            try:
                chunk = key.fileobj.recv(pace["per_tick"])
            except BlockingIOError:
                continue
            except OSError as exc:
                state["error"], chunk = str(exc), b""
            if chunk:
                state["data"] += chunk
                continue
            state["done"] = True
            sel.unregister(key.fileobj)
            key.fileobj.close()
        time.sleep(pace["pause"])
    for key in list(sel.get_map().values()):
        key.data["error"] = "timed out"
        key.fileobj.close()
    _ignore_from_now_on(signal.SIGUSR1)
    report = []
    for state in results:
        head, _, body = bytes(state["data"]).partition(b"\r\n\r\n")
        length = None
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        ok = state["error"] is None and length is not None and len(body) == length
        report.append({"ok": ok, "bytes": len(body), "expected": length,
                       "sha256": hashlib.sha256(body).hexdigest(), "error": state["error"]})
    return report


def summarize(records, event):
    """What the load saw around an event (epoch seconds).

    gap: from the event to the end of the first request, started after it,
    that succeeded: how long the VIP took to answer again.
    """
    failed = [r for r in records if not r[2]]
    after = [r for r in records if r[0] >= event and r[2]]
    gap = (after[0][1] - event) if after else None
    return {"requests": len(records), "failed": len(failed), "gap": gap}


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m lbctl.lab.traffic")
    sub = parser.add_subparsers(dest="kind", required=True)
    p = sub.add_parser("load")
    # probes: the same stream, but no request waits for the one before it.
    r = sub.add_parser("probes")
    for each in (p, r):
        each.add_argument("address")
        each.add_argument("--port", type=int, default=80)
        each.add_argument("--seconds", type=float, required=True)
        each.add_argument("--interval", type=float, default=0.02)
        each.add_argument("--timeout", type=float, default=0.5)
    r.add_argument("--retries", type=int, default=0)
    r.add_argument("--retry-delay", type=float, default=1.0)
    d = sub.add_parser("downloads")
    d.add_argument("address")
    d.add_argument("--port", type=int, default=80)
    d.add_argument("--count", type=int, required=True)
    d.add_argument("--path", default="/blob")
    d.add_argument("--rate", type=int, required=True, help="bytes per second per download")
    d.add_argument("--timeout", type=float, default=120, help="seconds before giving up")
    args = parser.parse_args(argv)
    if args.kind in ("load", "probes"):
        if args.kind == "load":
            result = steady_load(args.address, args.port, args.seconds, args.interval,
                                 args.timeout)
        else:
            result = probes(args.address, args.port, args.seconds, args.interval, args.timeout,
                            retries=args.retries, retry_delay=args.retry_delay)
    else:
        result = slow_downloads(args.address, args.port, args.count, args.path, args.rate,
                                timeout=args.timeout)
    json.dump(result, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())

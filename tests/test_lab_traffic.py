"""The lab's measuring client against a web server on this machine's loopback."""

import http.server
import json
import signal
import subprocess
import sys
import threading
import time

import pytest

from lbctl.lab.traffic import failed_client_port


class SlowHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"
    delay = 0.0

    def do_GET(self):
        time.sleep(self.delay)
        body = b"served by loopback\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class QuietServer(http.server.ThreadingHTTPServer):
    """A reply to a client that gave up fails: said by the test, not as a
    traceback on standard error, which a later test's capture may catch."""

    def handle_error(self, request, client_address):
        pass


@pytest.fixture
def server():
    httpd = QuietServer(("127.0.0.1", 0), SlowHandler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def load(port, *args):
    return subprocess.Popen([sys.executable, "-m", "lbctl.lab.traffic", "load", "127.0.0.1",
                             "--port", str(port), *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_sigint_ends_the_load_after_the_request_in_flight(server):
    """A request stalled when the load is told to stop is counted as it ends,
    not left out: a test stopping its load right after a failover must see
    the requests the failover held up."""
    SlowHandler.delay = 1.0
    proc = load(server.server_address[1], "--seconds", 60, "--interval", 0.05, "--timeout", 5)
    time.sleep(1.5)  # the second request is in flight
    interrupted = time.time()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    records = json.loads(out)
    assert [r[2:] for r in records] == [[True, "served by loopback"]] * 2, records
    assert records[-1][0] < interrupted < records[-1][1]


def test_a_request_that_times_out_names_its_step_and_port(server):
    SlowHandler.delay = 3.0
    proc = load(server.server_address[1], "--seconds", 0.1, "--timeout", 0.5)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    ((_start, _end, ok, body),) = json.loads(out)
    assert not ok
    assert body.startswith("error: request from port "), body
    assert body.endswith(": TimeoutError: timed out"), body
    assert 1024 <= failed_client_port(body) <= 65535


class BlobHandler(SlowHandler):
    BODY = bytes(range(256)) * 1024  # 256 KiB: minutes at the test's pace

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.BODY)))
        self.end_headers()
        self.wfile.write(self.BODY)


def test_downloads_say_they_started_only_once_they_can_be_hurried():
    """A test hurries its downloads as soon as its change is made.  The
    started line comes after the handler is in place and every download has
    asked: hurried at once, they still all arrive, and well before the slow
    pace would have let them."""
    from lbctl.lab.traffic import STARTED

    httpd = QuietServer(("127.0.0.1", 0), BlobHandler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        proc = subprocess.Popen([sys.executable, "-m", "lbctl.lab.traffic", "downloads",
                                 "127.0.0.1", "--port", str(httpd.server_address[1]),
                                 "--count", "3", "--rate", "1024", "--timeout", "60"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert proc.stderr.readline() == STARTED + "\n"
        proc.send_signal(signal.SIGUSR1)
        out, err = proc.communicate(timeout=120)
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert proc.returncode == 0, err
    assert [(d["ok"], d["bytes"], d["error"]) for d in json.loads(out)] == \
        [(True, len(BlobHandler.BODY), None)] * 3


def test_a_hurry_that_comes_as_the_downloads_end_is_ignored(server):
    """The interpreter's exit puts a handled signal back to its default
    action, which for SIGUSR1 ends the process: a test that hurries
    downloads just done would lose their report.  Done, the client ignores it."""
    from lbctl.lab.traffic import slow_downloads

    before = signal.getsignal(signal.SIGUSR1)
    try:
        slow_downloads("127.0.0.1", server.server_address[1], 1, "/", 1 << 20)
        assert signal.getsignal(signal.SIGUSR1) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGUSR1, before)


class FirstSlowHandler(SlowHandler):
    """Slower than the client's patience for the first request only."""
    served = 0

    def do_GET(self):
        FirstSlowHandler.served += 1
        self.delay = 1.0 if FirstSlowHandler.served == 1 else 0.0
        super().do_GET()


@pytest.mark.parametrize("retries,answered", [(0, False), (1, True)])
def test_a_probe_that_fails_is_made_again_after_the_delay_when_asked(retries, answered,
                                                                     capsys):
    from lbctl.lab.traffic import STARTED, probes

    FirstSlowHandler.served = 0
    httpd = QuietServer(("127.0.0.1", 0), FirstSlowHandler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        ((start, end, ok, body),) = probes("127.0.0.1", httpd.server_address[1], 0.01, 1, 0.5,
                                          retries=retries, retry_delay=0.3)
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert ok == answered, body
    assert capsys.readouterr().err.startswith(STARTED + "\n")  # what a timing caller waits for
    # One record spans both attempts: the user waited for them all.
    assert end - start >= (0.8 if answered else 0.5)

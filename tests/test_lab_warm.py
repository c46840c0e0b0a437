"""The lab's warm lbctl (lbctl.lab.warm): a command run through it answers
as a new `lbctl` process would, in the namespace named, and no longer."""

import os
import signal
import subprocess
import sys
import time

import pytest

import lbctl

from lbctl.errors import LabError
from lbctl.lab import warm as warm_module
from lbctl.lab import warm_relay
from lbctl.lab.warm import WarmLbctl

CLUSTER = """\
cluster: warm
balancers:
  lb1: {address: 10.77.0.2, interface: eth0}
workers:
  pi1: {address: 10.77.0.3}
services:
  web: {vip: 10.77.0.10, port: 80}
"""


@pytest.fixture
def node(tmp_path):
    """A namespace of its own, and the warm lbctl for it."""
    assert os.geteuid() == 0, "dev.sh runs the unit tests as root"
    name = f"lbctl-warm-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    folder = tmp_path / "warm"
    folder.mkdir(mode=0o700)
    warm = WarmLbctl(name, str(folder / "node.sock"))
    try:
        yield name, warm
    finally:
        warm.stop()
        subprocess.run(["ip", "netns", "del", name], check=False)


def as_a_process(name, *args, cwd=None, env=None):
    return subprocess.run(["ip", "netns", "exec", name, sys.executable, "-m", "lbctl", *args],
                          capture_output=True, text=True, cwd=cwd, env=env)


def test_a_command_answers_as_a_new_lbctl_process_would(node, tmp_path, monkeypatch):
    name, warm = node
    (tmp_path / "c.yaml").write_text(CLUSTER)
    (tmp_path / "bad.yaml").write_text(CLUSTER + "surprise: 1\n")
    warm.run(["--version"], timeout=60)  # the server starts in another folder
    monkeypatch.chdir(tmp_path)  # relative paths are the caller's
    (tmp_path / "root" / "run").mkdir(parents=True)
    monkeypatch.setenv("LBCTL_ROOT", str(tmp_path / "root"))  # not this machine's own files
    for args in (["--version"], ["no-such-command"], ["validate", "c.yaml"],
                 ["validate", "bad.yaml"], ["plan", "c.yaml", "--node", "pi1"]):
        warm_done = warm.run(args, timeout=60)
        cold = as_a_process(name, *args, cwd=tmp_path)
        assert (warm_done.returncode, warm_done.stdout, warm_done.stderr) == \
            (cold.returncode, cold.stdout, cold.stderr), args
    # The codes differ between them: usage 64, a bad file 1.
    assert warm.run(["no-such-command"], timeout=60).returncode == 64
    assert "bad.yaml:8:1: top level: unknown key" in warm.run(["validate", "bad.yaml"], timeout=60).stderr


def test_merged_output_comes_back_in_the_order_written_as_a_terminal_shows_it(node, tmp_path,
                                                                            monkeypatch):
    name, warm = node
    (tmp_path / "bad.yaml").write_text(CLUSTER + "surprise: 1\n")
    monkeypatch.chdir(tmp_path)
    # One pipe holds both: what lbctl wrote on stderr comes back in stdout.
    apart = warm.run(["validate", "bad.yaml"], timeout=60)
    merged = warm.run(["validate", "bad.yaml"], timeout=60, merged=True)
    assert "unknown key" in apart.stderr and apart.stdout == ""
    assert (merged.returncode, merged.stdout, merged.stderr) == (apart.returncode, apart.stderr, "")


def test_the_callers_environment_reaches_the_command(node, tmp_path, monkeypatch):
    _, warm = node
    (tmp_path / "c.yaml").write_text(CLUSTER)
    root = tmp_path / "no-such-root"
    monkeypatch.setenv("LBCTL_ROOT", str(root))
    done = warm.run(["apply", str(tmp_path / "c.yaml"), "--node", "pi1"], timeout=60)
    # apply looks for its folders under the root the environment names.
    assert done.returncode == 1 and f"{root}/run: no such file" in done.stderr, done
    monkeypatch.setenv("SUDO_USER", "someone")
    refused = warm.run(["plan", str(tmp_path / "c.yaml"), "--node", "pi1"], timeout=60)
    assert refused.returncode == 1 and "refused under sudo" in refused.stderr, refused


def test_a_command_past_its_time_is_stopped(node, tmp_path):
    _, warm = node
    started = time.monotonic()
    with pytest.raises(LabError, match="no answer after 2 s") as stopped:
        warm.run(["status", "--watch", "--interval", "1", "--root", str(tmp_path)], timeout=2)
    # Where it was when stopped: the frames the watch had drawn.
    assert "--- its stdout so far (the end):\n" in str(stopped.value)
    assert "every 1s" in str(stopped.value).partition("so far")[2]
    assert time.monotonic() - started < 10
    assert warm.run(["--version"], timeout=60).returncode == 0  # the server goes on


def test_a_namespace_made_anew_gets_a_server_of_its_own(node):
    name, warm = node
    assert warm.run(["--version"], timeout=60).returncode == 0
    first = warm.process.pid
    subprocess.run(["ip", "netns", "del", name], check=True)
    subprocess.run(["ip", "netns", "add", name], check=True)
    assert warm.run(["--version"], timeout=60).returncode == 0
    assert warm.process.pid != first
    with open(f"/proc/{warm.process.pid}/ns/net") as fh:
        in_server = os.fstat(fh.fileno()).st_ino
    assert in_server == os.stat(f"/run/netns/{name}").st_ino


def test_the_server_ends_with_the_lab_and_leaves_no_socket(node):
    name, warm = node
    assert warm.run(["--version"], timeout=60).returncode == 0
    server = warm.process
    warm.stop()
    assert server.returncode == 0  # it ended by itself once the lab's end closed
    assert not os.path.exists(warm.path)
    assert warm.run(["--version"], timeout=60).returncode == 0  # and starts again when asked


def test_a_namespace_gone_is_an_error_that_names_it(node):
    name, warm = node
    subprocess.run(["ip", "netns", "del", name], check=True)
    with pytest.raises(LabError, match=f"no network namespace {name}"):
        warm.run(["--version"], timeout=60)


def relay_argv(name, warm, *args):
    """`lbctl ARGS` as a node's sshd runs it: the relay script, in the
    server's folder (root's alone)."""
    script = os.path.join(os.path.dirname(warm.path), "lbctl")
    if not os.path.exists(script):
        with open(script, "w") as fh:
            fh.write(warm_relay.script_text(sys.executable, warm.path))
        os.chmod(script, 0o700)
    return ["ip", "netns", "exec", name, script, *args]


def relayed(name, warm, *args, stdin="", cwd=None):
    return subprocess.run(relay_argv(name, warm, *args), input=stdin, capture_output=True,
                          text=True, cwd=cwd, timeout=60)


def test_a_relayed_command_answers_as_a_new_lbctl_process_would(node, tmp_path, monkeypatch):
    """What `--all` reads from a node: the cluster file on stdin, its
    environment's root and working directory, and its output and exit
    status as lbctl's own."""
    name, warm = node
    subprocess.run(["ip", "-n", name, "address", "add", "10.77.0.3/24", "dev", "lo"], check=True)
    warm.ensure()  # the server starts in another folder, without what follows
    (tmp_path / "root" / "run").mkdir(parents=True)
    (tmp_path / "here.yaml").write_text(CLUSTER)
    monkeypatch.setenv("LBCTL_ROOT", str(tmp_path / "root"))
    bad = CLUSTER + "surprise: 1\n"
    for args, stdin in ((["--version"], ""), (["--expect-version", "0.0.1", "--version"], ""),
                        (["plan", "-", "--node", "pi1"], CLUSTER), (["validate", "here.yaml"], ""),
                        (["validate", "-"], bad), (["no-such-command"], "")):
        through = relayed(name, warm, *args, stdin=stdin, cwd=tmp_path)
        cold = subprocess.run(["ip", "netns", "exec", name, sys.executable, "-m", "lbctl", *args],
                              input=stdin, capture_output=True, text=True, cwd=tmp_path)
        assert (through.returncode, through.stdout, through.stderr) == \
            (cold.returncode, cold.stdout, cold.stderr), args
    # The cases differ: a plan under the root given (0), another version (3),
    # a file found from the working directory (0), a bad one from stdin (1).
    planned = relayed(name, warm, "plan", "-", "--node", "pi1", stdin=CLUSTER)
    assert planned.returncode == 0 and "10.77.0.10" in planned.stdout, planned
    monkeypatch.setenv("LBCTL_ROOT", str(tmp_path / "no-such-root"))
    assert "no-such-root/run: no such file" in relayed(
        name, warm, "apply", "-", "--node", "pi1", stdin=CLUSTER).stderr
    assert relayed(name, warm, "--expect-version", "0.0.1", "--version").returncode == 3
    assert relayed(name, warm, "validate", "here.yaml", cwd=tmp_path).returncode == 0
    assert relayed(name, warm, "validate", "here.yaml", cwd="/").returncode == 1
    assert "<stdin>:8:1: top level: unknown key" in relayed(name, warm, "validate", "-",
                                                           stdin=bad).stderr


def in_namespace(name):
    listed = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True)
    return {int(pid) for pid in listed.stdout.split()}


def running_relayed(name, warm):
    """A relayed command that runs until stopped (it waits on a stdin that
    never closes), once the command runs: (the relay, the command's pid)."""
    warm.ensure()
    relay = subprocess.Popen(relay_argv(name, warm, "validate", "-"), stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while not in_namespace(name) - {warm.process.pid, relay.pid}:
        assert time.monotonic() < deadline and relay.poll() is None, relay.communicate()
        time.sleep(0.05)
    (command,) = in_namespace(name) - {warm.process.pid, relay.pid}
    return relay, command


def gone(pid, seconds=10):
    deadline = time.monotonic() + seconds
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.05)
    return not os.path.exists(f"/proc/{pid}")


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL])
def test_a_relay_that_ends_takes_its_command_with_it(node, how):
    """A relay stopped (TERM) or killed outright: nothing of its command runs
    on in the node, as a real one whose session closed would not; a TERM
    reaches the command, and the relay ends by it too."""
    name, warm = node
    relay, command = running_relayed(name, warm)
    try:
        os.kill(relay.pid, how)
        assert relay.wait(timeout=30) == -how
        assert gone(command), f"the command {command} still runs"
    finally:
        relay.kill()
        relay.wait()
        for stream in (relay.stdin, relay.stdout, relay.stderr):
            stream.close()
    assert warm.run(["--version"], timeout=60).returncode == 0  # the server goes on


def set_module_trap(folder):
    """A yaml.py in `folder` that ends any Python importing it."""
    (folder / "yaml.py").write_text("raise SystemExit('the folder yaml.py was imported')\n")


def assert_trap_not_imported(done):
    """`lbctl validate -` with an empty stdin: lbctl's own file error, not the trap's."""
    assert "the folder yaml.py" not in done.stderr, done.stderr
    assert done.returncode == 1 and "<stdin>" in done.stderr, done


def test_a_relay_with_no_server_starts_lbctl_itself(node, tmp_path):
    """As the installed lbctl: nothing imported from the folder it runs in."""
    name, warm = node
    warm.ensure()
    warm.stop()
    done = relayed(name, warm, "--version")
    assert (done.returncode, done.stdout) == (0, f"lbctl {lbctl.__version__}\n"), done
    set_module_trap(tmp_path)
    assert_trap_not_imported(relayed(name, warm, "validate", "-", cwd=tmp_path))


def test_a_relay_refuses_a_server_in_another_namespace(node):
    """An sshd left in a namespace that was made anew: the server now runs
    in the new one, and the relay does not run its command there."""
    name, warm = node
    warm.ensure()
    other = f"{name}-other"
    subprocess.run(["ip", "netns", "add", other], check=True)
    try:
        done = subprocess.run(relay_argv(other, warm, "--version"), capture_output=True,
                              text=True, timeout=60)
    finally:
        subprocess.run(["ip", "netns", "del", other], check=False)
    assert done.returncode == 70, done  # not 255: --all would read it as unreachable
    assert "runs in another network namespace" in done.stderr


def test_the_servers_end_takes_the_commands_still_running(node):
    name, warm = node
    relay, command = running_relayed(name, warm)
    try:
        warm.stop()
        assert gone(command), f"the command {command} outlived the lab's server"
        assert relay.wait(timeout=30) == 70
        assert b"ended before the command did" in relay.stderr.read()
    finally:
        relay.kill()
        relay.wait()
        for stream in (relay.stdin, relay.stdout, relay.stderr):
            stream.close()


def test_a_plan_and_its_fingerprint_do_not_depend_on_the_hash_seed(node, tmp_path):
    """Every command of one warm server shares its hash seed, where each real
    lbctl start has its own: apply --all compares the fingerprint of a plan
    shown by one process with the plan of another, so no plan may follow the
    order of a set.  Checked here with fresh processes and different seeds."""
    name, _ = node
    example = os.path.join(os.path.dirname(lbctl.__file__), "data", "examples", "pi-pair.yaml")
    subprocess.run(["ip", "-n", name, "link", "add", "eth0", "type", "veth", "peer", "name", "eth1"], check=True)
    subprocess.run(["ip", "-n", name, "link", "set", "eth0", "up"], check=True)
    for address in ("192.168.100.2/24", "192.168.100.3/24"):  # lb1's and pi1's
        subprocess.run(["ip", "-n", name, "address", "add", address, "dev", "eth0"], check=True)
    for node_name in ("lb1", "pi1"):
        seen = set()
        for seed in ("1", "2", "3", "4"):
            root = tmp_path / f"root-{node_name}-{seed}"
            (root / "run").mkdir(parents=True)
            done = subprocess.run(
                ["ip", "netns", "exec", name, sys.executable, "-m", "lbctl", "plan", example,
                 "--node", node_name, "--root", str(root), "--fingerprint"],
                capture_output=True, text=True, env={**os.environ, "PYTHONHASHSEED": seed})
            assert done.returncode == 0, done.stderr
            seen.add((done.stdout.replace(str(root), "ROOT"),
                      [line for line in done.stderr.splitlines() if "fingerprint" in line][0]))
        assert len(seen) == 1, (node_name, seen)
        ((shown, _),) = seen
        assert shown.count(" + ") > 3, shown  # a plan with something in it




def test_a_callers_connection_closed_earlier_in_the_same_round_is_passed_over():
    """The server's loop can see a command's end and its caller leaving in
    one round: reporting the end closes the connection, and the caller's
    event that follows must not end the server."""
    import selectors
    import socket

    ours, theirs = socket.socketpair()
    with selectors.DefaultSelector() as selector:
        no_such_pid = 4194305  # above any pid_max: should it be signalled, nothing is
        key = selector.register(ours, selectors.EVENT_READ, (warm_module.CALLER, no_such_pid))
        theirs.close()
        selector.unregister(ours)  # what _report_end does to it first
        ours.close()
        warm_module._caller_spoke(selector, key)


def test_a_request_carries_argv_environment_and_folder_as_the_kernel_gave_them():
    from lbctl.lab.warm_relay import decode_request, encode_request

    odd = os.fsdecode(b"caf\xe9")  # not UTF-8: kept as the bytes it was
    argv = ["apply", "", "a=b", "two words", odd, "\n"]
    env = {"PATH": "/usr/bin", "EMPTY": "", "EQUALS": "x=y=z", "ODD": odd}
    assert decode_request(encode_request(argv, env, "/tmp/" + odd)) == (argv, env, "/tmp/" + odd)
    assert decode_request(encode_request([], {}, "/")) == ([], {}, "/")
    for bad in (b"", b"{}", b"lbctl-warm-1\0/\x003\0only-one", b"other\0/\x000"):
        with pytest.raises(ValueError):
            decode_request(bad)


def test_a_cold_node_finds_the_installed_lbctl_first_and_can_turn_warm(tmp_path):
    """LabSsh.make_cold: the `lbctl` first on a cold node's PATH is the
    venv's own entry point; a warm node's is the relay to its server."""
    from types import SimpleNamespace

    from lbctl.lab.sshd import LabSsh

    nodes = {name: SimpleNamespace(name=name) for name in ("pi1", "pi3")}
    lab = SimpleNamespace(workdir=str(tmp_path), nodes=nodes,
                          warm_socket=lambda name: f"/run/warm/{name}.sock")
    ssh = LabSsh(lab, cold=["pi3"])
    ssh.processes = dict.fromkeys(nodes)  # both sshd running
    folders = {name: ssh._lbctl_cold_or_relaying(node) for name, node in nodes.items()}

    def first_lbctl(name):
        for folder in (folders[name], os.path.dirname(sys.executable)):
            if os.path.exists(os.path.join(folder, "lbctl")):
                return open(os.path.join(folder, "lbctl")).read()

    assert "import warm_relay" in first_lbctl("pi1") and "/run/warm/pi1.sock" in first_lbctl("pi1")
    assert "import warm_relay" not in first_lbctl("pi3")  # the console script pip wrote
    ssh.make_cold([])
    assert "/run/warm/pi3.sock" in first_lbctl("pi3")
    ssh.make_cold(["pi1"])
    assert "import warm_relay" not in first_lbctl("pi1")
    assert "/run/warm/pi3.sock" in first_lbctl("pi3")


def test_the_server_imports_nothing_from_the_folder_it_was_started_in(node, tmp_path,
                                                                        monkeypatch):
    """A module-named file in the lab's working directory (a test's yaml.py)
    is not what lbctl imports: an installed lbctl would not see it either."""
    name, warm = node
    set_module_trap(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert_trap_not_imported(warm.run(["validate", "-"], timeout=60))


def test_doctor_after_scapy_was_imported_answers_as_a_new_process_would(node, tmp_path,
                                                                         monkeypatch):
    """The server imports scapy for the first doctor it runs; a later one,
    with an interface added between, answers as a fresh process does."""
    name, warm = node
    (tmp_path / "c.yaml").write_text(CLUSTER)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LBCTL_ROOT", str(tmp_path))
    args = ["doctor", "c.yaml", "--node", "lb1", "--root", str(tmp_path)]
    first = warm.run(args, timeout=120)
    for step in (["link", "add", "eth0", "type", "veth", "peer", "name", "eth1"],
                 ["addr", "add", "10.77.0.2/24", "dev", "eth0"], ["link", "set", "eth0", "up"]):
        subprocess.run(["ip", "-n", name, *step], check=True)
    warm_done = warm.run(args, timeout=120)
    cold = as_a_process(name, *args, cwd=tmp_path)
    assert (warm_done.returncode, warm_done.stdout, warm_done.stderr) == \
        (cold.returncode, cold.stdout, cold.stderr)
    assert first.returncode == 1 and "which this host does not have" in first.stderr, first
    assert "who-has 10.77.0.3 on eth0" in warm_done.stdout  # the wire check ran


def test_a_command_sees_the_interfaces_scapy_did_not_know_at_import(tmp_path):
    """What the warm server does in each child before a command runs."""
    name = f"lbctl-scapy-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    script = ("import subprocess, sys\n"
              "from scapy.config import conf\n"
              "import scapy.route\n"
              "subprocess.run(['ip', 'link', 'add', 'late0', 'type', 'veth', 'peer', 'name', 'late1'], check=True)\n"
              "before = 'late0' in conf.ifaces\n"
              "from lbctl.lab.warm import _fresh_scapy_view\n"
              "_fresh_scapy_view()\n"
              "print(before, 'late0' in conf.ifaces)\n")
    try:
        done = subprocess.run(["ip", "netns", "exec", name, sys.executable, "-c", script],
                              capture_output=True, text=True, timeout=120)
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)
    assert done.stdout.split() == ["False", "True"], done.stderr


def test_the_server_imports_scapy_once_and_not_for_doctor_all():
    script = ("import sys\n"
              "from lbctl.lab import warm\n"
              "warm._probes_the_wire(['doctor', 'c.yaml', '--all']) and warm._preload_doctor()\n"
              "print('scapy.sendrecv' in sys.modules)\n"
              "warm._probes_the_wire(['doctor', 'c.yaml']) and warm._preload_doctor()\n"
              "print(warm._doctor_preloaded, 'scapy.sendrecv' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert done.stdout.split() == ["False", "True", "True"], done.stderr


@pytest.mark.parametrize("python", ["/opt/with space/bin/python", "/opt/" + "p" * 220])
def test_an_interpreter_a_hash_bang_line_cannot_name_is_started_by_sh(tmp_path, python):
    """A #! line is split at blanks and cut at 255 bytes."""
    text = warm_relay.script_text(python, "/run/it's.sock")
    assert text.startswith("#!/bin/sh\n")
    script = tmp_path / "lbctl"
    script.write_text(text.replace("exec ", "printf '%s\\n' ", 1))
    shown = subprocess.run(["sh", str(script), "a b"], capture_output=True, text=True)
    assert shown.stdout.splitlines() == [python, "-I", "-S",
                                         os.path.join(os.path.dirname(warm_relay.__file__),
                                                      "warm_relay.py"),
                                         "/run/it's.sock", "a b"]

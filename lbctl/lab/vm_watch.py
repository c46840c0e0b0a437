"""The lab VM watching its own job: when the job goes quiet, what is the guest doing?

The job's output is relayed to the console through PID 1, which so knows
when it last spoke.  After SILENCE seconds without a word, or when the
host asks (its time limit is near: it creates DUMP_REQUEST in the results
folder), the guest prints its memory, the kernel's pressure figures, and
every task blocked in the kernel (D state) with its kernel stack, followed
by the kernel's own list of blocked tasks (sysrq w).  Everything is read
from /proc: a guest whose fork is what hangs can still report.
"""

import os
import threading
import time

SILENCE = 300  # seconds: longer than the slowest test is quiet (about 4 min)
DUMP_REQUEST = "dump-request"
MEMINFO_KEYS = ("MemTotal", "MemAvailable", "Shmem", "Dirty", "Writeback", "Slab")


class Watch:
    def __init__(self, results_dir, silence=SILENCE, poll=5.0):
        self.request = os.path.join(results_dir, DUMP_REQUEST)
        self.silence = silence
        self.poll = poll
        self.last_output = time.monotonic()
        self.started = time.monotonic()
        self._lock = threading.Lock()
        self._stopped = threading.Event()

    def relay(self, source_fd, target_fd):
        """Copy the job's output to the console until the job's end closes it."""
        while True:
            try:
                chunk = os.read(source_fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            with self._lock:
                os.write(target_fd, chunk)
                self.last_output = time.monotonic()
        os.close(source_fd)

    def watch(self):
        """Report a silence once per SILENCE seconds of it, and whenever the host asks."""
        reported = self.last_output
        while not self._stopped.wait(self.poll):
            if os.path.exists(self.request):
                try:
                    os.unlink(self.request)
                except OSError:
                    pass
                self.report("the host's time limit for the lab VM is near")
                reported = time.monotonic()
            quiet_since = max(self.last_output, reported)
            if time.monotonic() - quiet_since >= self.silence:
                self.report(f"no output for {time.monotonic() - self.last_output:.0f} s")
                reported = time.monotonic()

    def start(self, stdout_fd, stderr_fd):
        for source, target in ((stdout_fd, 1), (stderr_fd, 2)):
            threading.Thread(target=self.relay, args=(source, target), daemon=True).start()
        threading.Thread(target=self.watch, daemon=True).start()
        return self

    def stop(self):
        self._stopped.set()

    def report(self, why):
        text = "\n".join([
            f"=== lab VM, {time.monotonic() - self.started:.0f} s after start: {why}",
            memory(), pressure(), blocked_tasks(), kernel_blocked_list(),
            "=== end of the lab VM's report", ""])
        with self._lock:
            os.write(2, text.encode(errors="replace"))


def _read(path):
    try:
        with open(path, errors="replace") as fh:
            return fh.read()
    except OSError as exc:
        return f"({exc.strerror})"


def memory():
    info = dict(line.split(":", 1) for line in _read("/proc/meminfo").splitlines() if ":" in line)
    return "memory: " + ", ".join(f"{k} {info[k].strip()}" for k in MEMINFO_KEYS if k in info)


def pressure():
    lines = []
    for kind in ("cpu", "memory", "io"):
        for line in _read(f"/proc/pressure/{kind}").splitlines():
            lines.append(f"pressure {kind}: {line}")
    return "\n".join(lines)


def blocked_tasks():
    """Every task in D state: pid, name, how long the process has run, its
    kernel wait channel and stack, and its command line."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        for task in _tasks(pid):
            name = parse_d_state(_read(f"/proc/{pid}/task/{task}/stat"))
            if name is None:
                continue
            cmdline = _read(f"/proc/{pid}/cmdline").replace("\0", " ").strip()
            wchan = _read(f"/proc/{pid}/task/{task}/wchan")
            stack = _read(f"/proc/{pid}/task/{task}/stack").rstrip()
            found.append(f"D {pid}/{task} {name} wchan={wchan} cmd={cmdline[:200]}\n{stack}")
    return "tasks in D state:\n" + ("\n".join(found) if found else "(none)")


def parse_d_state(stat):
    """A task's name if its stat line says D (waiting in the kernel), else None.
    The name sits in parentheses and may hold any character, ")" too."""
    name_end = stat.rfind(")")
    if name_end < 0 or stat[name_end + 2:name_end + 3] != "D":
        return None
    return stat[stat.find("(") + 1:name_end]


def _tasks(pid):
    try:
        return os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []


def kernel_blocked_list():
    """sysrq w, as the kernel log has it: the console shows only its header."""
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        return f"(kernel log: {exc.strerror})"
    try:
        os.lseek(fd, 0, os.SEEK_END)
        with open("/proc/sysrq-trigger", "w") as fh:
            fh.write("w")
        time.sleep(1)
        lines = []
        while len(lines) < 400:
            try:
                record = os.read(fd, 8192).decode(errors="replace")
            except BlockingIOError:
                break
            except OSError:  # a record overwritten meanwhile: read on
                continue
            lines.append(record.split(";", 1)[-1].rstrip())
        return "kernel's blocked tasks (sysrq w):\n" + "\n".join(lines)
    except OSError as exc:
        return f"(sysrq w: {exc.strerror})"
    finally:
        os.close(fd)

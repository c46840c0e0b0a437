"""Run a command inside a small VM whose kernel has IPVS.

Where the host kernel lacks IPVS (as on many CI machines), the lab boots
Debian's own kernel under qemu's emulation (TCG: on these hosts a KVM guest
does not start, see docs/lab.md), with the host's root filesystem shared
read-only over 9p and a tmpfs overlay on top.  Everything installed on the host, the venv included, works inside,
and nothing the lab writes reaches the host.  One VM serves a whole test
session: booting costs a few seconds, so it is never done per test.

User-mode Linux was tried first: its 6.1 kernel cannot keep AVX-512 state on
hosts with AMX, and Python crashes at start-up there.  A real kernel under
qemu has no such limit.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from lbctl.errors import LabError
from lbctl.lab.shell import run as run_checked

KERNEL_METAPACKAGE = "linux-image-amd64"
INITRAMFS_MODULES = (
    "virtio", "virtio_ring", "virtio_pci_legacy_dev", "virtio_pci_modern_dev",
    "virtio_pci", "netfs", "fscache", "9pnet", "9pnet_virtio", "9p", "overlay",
)


def host_has_ipvs():
    """True when this kernel can run IPVS itself (a Pi, a distro kernel)."""
    if os.path.exists("/proc/net/ip_vs"):
        return True
    probe = subprocess.run(["modprobe", "-q", "ip_vs"], capture_output=True)
    return probe.returncode == 0 and os.path.exists("/proc/net/ip_vs")


def cache_dir():
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "lbctl" / "lab-kernel"


def _kernel_package():
    """The versioned package behind Debian's kernel metapackage."""
    out = run_checked(["apt-cache", "depends", KERNEL_METAPACKAGE]).stdout
    for line in out.splitlines():
        name = line.strip().removeprefix("Depends:").strip()
        if line.strip().startswith("Depends:") and name.startswith("linux-image-"):
            return name
    raise LabError(f"apt-cache knows no kernel behind {KERNEL_METAPACKAGE}; run apt-get update")


def ensure_kernel():
    """Download and unpack Debian's kernel once; returns (vmlinuz, modules dir)."""
    package = _kernel_package()
    release = package.removeprefix("linux-image-")
    root = cache_dir() / release
    vmlinuz = root / "boot" / f"vmlinuz-{release}"
    modules = root / "lib" / "modules" / release
    if not (modules / "modules.dep").exists():
        root.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=root.parent) as tmp:
            run_checked(["apt-get", "download", package], cwd=tmp)
            (deb,) = Path(tmp).glob("*.deb")
            unpacked = Path(tmp) / "root"
            run_checked(["dpkg-deb", "-x", str(deb), str(unpacked)])
            run_checked(["depmod", "-b", str(unpacked), release])
            shutil.rmtree(root, ignore_errors=True)
            unpacked.rename(root)
    return vmlinuz, modules


def _module_paths(modules):
    """INITRAMFS_MODULES with their dependencies, in load order."""
    deps = {}
    for line in (modules / "modules.dep").read_text().splitlines():
        path, _, needs = line.partition(":")
        deps[Path(path).name.split(".ko")[0]] = (path, needs.split())
    by_path = {path: name for name, (path, _) in deps.items()}
    order = []

    def visit(name):
        path, needs = deps[name]
        for dep in reversed(needs):
            visit(by_path[dep])
        if path not in order:
            order.append(path)

    for name in INITRAMFS_MODULES:
        visit(name.replace("-", "_"))
    return order


def build_initramfs(modules, out):
    static = shutil.which("busybox", path="/bin:/usr/bin")
    # The initramfs has no C library: its busybox must be the static build.
    if static is None or subprocess.run(["ldd", static], capture_output=True).returncode == 0:
        raise LabError("the lab VM needs a static busybox: apt-get install busybox-static")
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp)
        for d in ("bin", "proc", "sys", "dev", "modules"):
            (tree / d).mkdir()
        shutil.copy2(static, tree / "bin" / "busybox")
        for applet in ("sh", "mount", "insmod", "mkdir", "sed", "cat", "switch_root", "echo"):
            (tree / "bin" / applet).symlink_to("busybox")
        names = []
        for rel in _module_paths(modules):
            shutil.copy2(modules / rel, tree / "modules" / Path(rel).name)
            names.append(Path(rel).name)
        (tree / "modules.order").write_text("\n".join(names) + "\n")
        init = tree / "init"
        shutil.copy2(Path(__file__).with_name("guest_init.sh"), init)
        init.chmod(0o755)
        files = sorted(str(p.relative_to(tree)) for p in tree.rglob("*"))
        with open(out, "wb") as fh:
            subprocess.run(["cpio", "--quiet", "-o", "-H", "newc"], cwd=tree,
                           input="\n".join(files).encode(), stdout=fh, check=True)


# The netns suite runs three labs at once (a pytest-xdist worker each), and
# every file they write lives in the guest's RAM.
def run(argv, cwd=None, memory_mb=4096, cpus=2):
    """Run argv inside the lab VM, its output on ours, and return its exit status."""
    if any(ch.isspace() for ch in sys.executable):
        raise LabError(f"the lab VM cannot pass {sys.executable!r} on a kernel command line; "
                       "use a Python whose path has no spaces")
    vmlinuz, modules = ensure_kernel()
    results = Path(tempfile.mkdtemp(prefix="lbctl-lab-", dir=_results_parent()))
    try:
        initrd = results / "initrd.cpio"
        build_initramfs(modules, initrd)
        # The guest's console is a terminal even when ours is a CI log: pass on
        # whether colours make sense here.
        env = dict(os.environ, LBCTL_LAB_VM="1")
        env.setdefault("PY_COLORS", "1" if sys.stdout.isatty() else "0")
        job = {"argv": list(argv), "cwd": str(cwd or os.getcwd()), "env": env,
               "modules": str(modules)}
        (results / "job.json").write_text(json.dumps(job))
        # quiet: the kernel's errors and warnings only (a hung task among
        # them), not every boot message.  mitigations=off: the guest runs
        # the lab alone, and its retpolines cost emulated cycles on every
        # indirect call of a kernel that mostly starts processes.
        # init_on_alloc=0: Debian's kernel zeroes every allocation, slab
        # and page cache included; a Python start took 10-12% longer so.
        cmdline = ("console=ttyS0 quiet panic=-1 net.ifnames=0 mitigations=off init_on_alloc=0 "
                   f"lbctl.results={results} lbctl.python={sys.executable}")
        qmp = results / "qmp.sock"
        qemu = [
            "qemu-system-x86_64", "-accel", "tcg,thread=multi", "-cpu", "max",
            "-m", str(memory_mb), "-smp", str(cpus), "-nodefaults", "-no-reboot",
            "-display", "none", "-monitor", "none", "-serial", "stdio",
            "-qmp", f"unix:{qmp},server=on,wait=off",
            "-kernel", str(vmlinuz), "-initrd", str(initrd), "-append", cmdline,
            "-virtfs", "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap",
            "-virtfs", f"local,path={results},mount_tag=results,security_model=none",
        ]
        proc = subprocess.Popen(qemu, stdin=subprocess.DEVNULL)
        _wait_within_limit(proc, results, qmp, time_limit())
        status_file = results / "exit-status"
        if not status_file.exists():
            raise LabError("the lab VM stopped without reporting an exit status")
        return int(status_file.read_text())
    finally:
        shutil.rmtree(results, ignore_errors=True)


def time_limit():
    """Seconds the lab VM may run: below CI's own limit, so a stalled guest
    is reported on (and the run ends) while the log still reaches someone."""
    return float(os.environ.get("LBCTL_LAB_VM_MINUTES", "80")) * 60


def _wait_within_limit(proc, results, qmp, limit, report_seconds=90):
    """Wait for qemu; past `limit`, ask the guest for its report (vm_watch),
    print every vCPU's registers from qemu's side, and stop the VM."""
    try:
        proc.wait(timeout=max(limit - report_seconds, 1))
        return
    except subprocess.TimeoutExpired:
        pass
    print(f"lbctl lab: the lab VM is near its limit of {limit / 60:.0f} min; asking it what "
          "it is doing", file=sys.stderr, flush=True)
    from lbctl.lab.vm_watch import DUMP_REQUEST

    (results / DUMP_REQUEST).write_text("")
    try:
        proc.wait(timeout=report_seconds)
        return
    except subprocess.TimeoutExpired:
        pass
    print("lbctl lab: the vCPUs as qemu sees them:\n" + qmp_command(qmp, "info registers -a"),
          file=sys.stderr, flush=True)
    proc.kill()
    proc.wait()
    raise LabError(f"the lab VM ran past its limit of {limit / 60:.0f} min "
                   "(LBCTL_LAB_VM_MINUTES); its report is above")


def qmp_command(path, command_line, timeout=30):
    """The text of a human monitor command, asked over qemu's QMP socket."""
    import socket

    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(str(path))
            replies = sock.makefile("r")
            replies.readline()  # the greeting
            for ask in ({"execute": "qmp_capabilities"},
                        {"execute": "human-monitor-command",
                         "arguments": {"command-line": command_line}}):
                sock.sendall(json.dumps(ask).encode() + b"\n")
                while True:  # events may come before the answer
                    answer = json.loads(replies.readline())
                    if "return" in answer or "error" in answer:
                        break
            return answer.get("return") or str(answer.get("error"))
    except (OSError, ValueError) as exc:
        return f"(qemu's QMP socket: {exc})"


def _results_parent():
    """A private host directory; the guest mounts it at the same path to report back."""
    parent = cache_dir().parent / "runs"
    parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    return parent


def run_with_ipvs(argv, cwd=None):
    """Run argv where IPVS works: right here when the kernel has it, else in the lab VM."""
    if os.environ.get("LBCTL_LAB_VM") == "1" or host_has_ipvs():
        return subprocess.run(argv, cwd=cwd).returncode
    print("lbctl lab: this kernel has no IPVS; running in a VM with Debian's kernel "
          "(emulated, so slower than this machine)", file=sys.stderr, flush=True)
    return run(argv, cwd=cwd)


def main(argv=None):
    """python -m lbctl.lab.vm [--] COMMAND...: run COMMAND with a real IPVS kernel."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        print("usage: python -m lbctl.lab.vm [--] COMMAND [ARG...]", file=sys.stderr)
        return 2
    try:
        return run_with_ipvs(argv)
    except LabError as exc:
        print(f"lbctl lab: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

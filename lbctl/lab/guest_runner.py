"""PID 1 of the lab VM, after the initramfs has built the copy-on-write root.

It gives the guest the mounts a normal boot would (proc, sys, run), makes the
lab kernel's modules loadable, runs the one job the host asked for, and writes
its exit status where the host can read it after the VM powers off.
"""

import json
import os
import subprocess
import sys
import time

from lbctl.lab.vm_watch import SILENCE, Watch

MODULES = (
    "ip_vs", "ip_vs_rr", "ip_vs_wrr", "ip_vs_lc", "ip_vs_wlc", "ip_vs_sh",
    "ip_vs_dh", "ip_vs_mh", "ip_vs_sed", "ip_vs_nq", "ip_vs_lblc",
    "ip_vs_lblcr", "ip_vs_fo", "ip_vs_ovf",
    "veth", "bridge", "dummy", "sch_tbf", "af_packet",
    "sch_ingress", "cls_u32", "act_gact",  # the lab's split-brain test drops VRRP with tc
    "sch_prio", "sch_netem",  # and a takeover test delays the sync daemon's datagrams
)


def _mount(fstype, target, source=None, options=None):
    os.makedirs(target, exist_ok=True)
    argv = ["mount", "-t", fstype]
    if options:
        argv += ["-o", options]
    subprocess.run(argv + [source or fstype, target], check=True)


def _prepare_system(job):
    _mount("proc", "/proc")
    _mount("sysfs", "/sys")
    _mount("tmpfs", "/run", options="mode=0755")
    _mount("tmpfs", "/dev/shm", options="mode=1777")
    # Terminals: tmux (the status --watch test) and anything else that opens a pty.
    os.makedirs("/dev/pts", exist_ok=True)
    _mount("devpts", "/dev/pts", options="mode=0620,ptmxmode=0666")
    if not os.path.exists("/dev/ptmx"):
        os.symlink("pts/ptmx", "/dev/ptmx")
    os.makedirs("/run/netns", exist_ok=True)
    release = os.uname().release
    target = f"/lib/modules/{release}"
    os.makedirs(target, exist_ok=True)
    subprocess.run(["mount", "--bind", job["modules"], target], check=True)
    for name in MODULES:
        subprocess.run(["modprobe", name], check=False)
    subprocess.run(["ip", "link", "set", "lo", "up"], check=False)
    # A task blocked in the kernel for 2 minutes is named on the console.
    try:
        with open("/proc/sys/kernel/hung_task_timeout_secs", "w") as fh:
            fh.write("120\n")
    except OSError as exc:
        print(f"lab-vm: no hung task warnings: {exc}", file=sys.stderr, flush=True)
    # The guest's hostname stands out in logs and prompts.
    subprocess.run(["hostname", "lbctl-lab"], check=False)


def _run_reaping(job, results_dir):
    """Run the job; as PID 1, also reap every orphan (daemons started by the job)
    so that a killed daemon is gone rather than left as a zombie.  The job's
    output reaches the console through a Watch, which reports on a silence."""
    out_read, out_write = os.pipe()
    err_read, err_write = os.pipe()
    proc = subprocess.Popen(job["argv"], cwd=job["cwd"], env=job["env"],
                            stdout=out_write, stderr=err_write)
    os.close(out_write)
    os.close(err_write)
    silence = float(job["env"].get("LBCTL_LAB_VM_SILENCE", SILENCE))
    Watch(results_dir, silence).start(out_read, err_read)
    while True:
        pid, wait_status = os.wait()
        if pid == proc.pid:
            proc.returncode = os.waitstatus_to_exitcode(wait_status)
            return proc.returncode


def main(results_dir):
    os.environ["PATH"] = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    with open(os.path.join(results_dir, "job.json")) as fh:
        job = json.load(fh)
    status = 1
    try:
        _prepare_system(job)
        status = _run_reaping(job, results_dir)
        time.sleep(1)  # the relays' last output, from a job that just ended
    except Exception as exc:  # PID 1 must always reach poweroff
        print(f"lab-vm: {exc}", file=sys.stderr, flush=True)
    with open(os.path.join(results_dir, "exit-status"), "w") as fh:
        fh.write(f"{status}\n")
    os.sync()
    subprocess.run(["umount", results_dir], check=False)
    subprocess.run(["busybox", "poweroff", "-f"], check=False)


if __name__ == "__main__":
    main(sys.argv[1])

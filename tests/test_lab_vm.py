"""The lab VM's own watch (lbctl.lab.vm_watch), run here on the host's /proc."""

import os
import time

from lbctl.lab.vm_watch import DUMP_REQUEST, Watch, parse_d_state


def test_the_job_s_output_is_relayed_and_a_silence_reported_with_what_the_guest_does(
        tmp_path, capfd):
    out_read, out_write = os.pipe()
    err_read, err_write = os.pipe()
    watch = Watch(str(tmp_path), silence=0.5, poll=0.1).start(out_read, err_read)
    os.write(out_write, b"test_a.py ..\n")
    os.write(err_write, b"a warning\n")
    time.sleep(1.5)
    watch.stop()
    captured = capfd.readouterr()
    assert captured.out == "test_a.py ..\n"
    assert captured.err.startswith("a warning\n=== lab VM, ")
    assert "no output for" in captured.err
    for part in ("memory: MemTotal ", "pressure cpu: some avg10=", "tasks in D state:",
                 "=== end of the lab VM's report"):
        assert part in captured.err, part
    os.close(out_write)
    os.close(err_write)


def test_the_host_s_request_is_answered_once(tmp_path, capfd):
    out_read, out_write = os.pipe()
    err_read, err_write = os.pipe()
    watch = Watch(str(tmp_path), silence=3600, poll=0.1).start(out_read, err_read)
    (tmp_path / DUMP_REQUEST).write_text("")
    time.sleep(1)
    watch.stop()
    err = capfd.readouterr().err
    assert err.count("the host's time limit for the lab VM is near") == 1, err
    assert not (tmp_path / DUMP_REQUEST).exists()
    os.close(out_write)
    os.close(err_write)


def test_a_task_in_d_state_is_told_from_its_stat_line():
    assert parse_d_state("1234 (python3 (x)) D 1 2 3") == "python3 (x)"
    assert parse_d_state("1234 (bash) S 1 2 3") is None
    assert parse_d_state("") is None

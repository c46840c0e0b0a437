"""The narrow sudo rule docs/security.md gives lets through every command
--all sends a node, and nothing else: checked by sudo itself.

sudo reads only /etc/sudoers, so each check runs in a mount namespace of its
own where the rule is /etc/sudoers and an lbctl is at /usr/local/sbin: the
host's sudo configuration is never touched."""

import json
import os
import re
import shlex
import subprocess
import sys
import textwrap

import pytest

from lbctl import __version__
from lbctl.remote.ssh import Target, ssh_argv

DOCS = os.path.join(os.path.dirname(__file__), "..", "docs", "security.md")
USER = "root"  # the rule is given to root here: sudo -l -U asks for any user

# Each node command --all and rollout send, as each sends it (remote/*,
# commands/cluster_*).
SENT = {
    "version check": ["--version"],
    "apply --all": ["apply", "-", "--node", "lb1", "--expect-plan", "0123abcd"],
    "apply --all --remove": ["apply", "-", "--node", "lb1", "--remove"],
    "plan --all": ["plan", "-", "--node", "lb1", "--detailed-exitcode", "--fingerprint"],
    "status --all": ["status", "-", "--node", "lb1", "--json", "--no-drift"],
    "doctor --all": ["doctor", "-", "--node", "pi1", "--json", "--no-wire"],
    "drain --all": ["drain", "pi1", "-", "--node", "lb1", "--check"],
    "drain --all --wait": ["drain", "pi1", "-", "--node", "lb1", "--wait", "--timeout", "60"],
    "undrain --all": ["undrain", "pi1", "-", "--node", "lb1"],
}
NOT_FOR_THE_RULE = {
    "lab": ["--expect-version", __version__, "lab", "demo", "apply"],
    "drain-balancer": ["--expect-version", __version__, "drain-balancer", "x.yaml"],
    "exporter": ["--expect-version", __version__, "exporter", "--listen", "0.0.0.0:9", "apply"],
    "rollout": ["--expect-version", __version__, "rollout", "x.yaml", "--exec", "sh"],
    "without the version check": ["apply", "x.yaml"],
}

CHECK = """
import json, os, subprocess, sys
sudoers, lbctl, asked = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
subprocess.run(["mount", "--bind", sudoers, "/etc/sudoers"], check=True)
subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0755", "lbctl", "/usr/local/sbin"], check=True)
with open("/usr/local/sbin/lbctl", "w") as fh:
    fh.write("#!/bin/sh\\n")
os.chmod("/usr/local/sbin/lbctl", 0o755)
answers = {}
for name, argv in asked.items():
    done = subprocess.run(["sudo", "-n", "-l", "-U", lbctl, "--", "/usr/local/sbin/lbctl", *argv],
                          capture_output=True, text=True)
    answers[name] = done.returncode == 0
print(json.dumps(answers))
"""


def documented_rule():
    """The rule's lines as docs/security.md shows them (an indented block)."""
    text = open(DOCS).read()
    found = re.search(r"\n((?:    Cmnd_Alias LBCTL.*\n)(?:    .*\n)*)", text)
    assert found, "docs/security.md shows no Cmnd_Alias LBCTL"
    return textwrap.dedent(found.group(1))


def sent_by_all(lbctl_args):
    """What sudo is asked to run on a node: the words after `sudo -n`."""
    command = ssh_argv(Target("lb1", "balancer", "192.0.2.2", sudo=True), lbctl_args)[-1]
    return shlex.split(re.search(r"else exec sudo -n (.*); fi$", command).group(1))[1:]


def allowed(rule, tmp_path, asked):
    """{name: whether sudo lets the user run lbctl with those words}."""
    sudoers = tmp_path / "sudoers"
    # The documented rule is for the deploy login "pi": here it is for USER.
    sudoers.write_text(rule.replace("\npi ALL=", f"\n{USER} ALL="))
    os.chmod(sudoers, 0o440)  # as sudo insists
    done = subprocess.run(["unshare", "--mount", "--propagation", "private", sys.executable, "-c",
                           CHECK, str(sudoers), USER, json.dumps(asked)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def rule():
    text = documented_rule()
    assert "\npi ALL=(root) NOPASSWD: LBCTL" in f"\n{text}", text
    return text


def test_the_documented_rule_lets_through_every_command_all_sends(rule, tmp_path):
    asked = {name: sent_by_all(args) for name, args in SENT.items()}
    assert all(words[:2] == ["--expect-version", __version__] for words in asked.values())
    answers = allowed(rule, tmp_path, asked)
    assert [name for name, ok in answers.items() if not ok] == [], answers


def test_the_documented_rule_refuses_what_all_never_sends(rule, tmp_path):
    # sudoers' * would match across words ("lab demo apply"): the rule is a
    # regular expression anchored on the command's first word.
    # One the rule allows, asked in the same run: a sudo that refuses
    # everything (a rule it cannot read) must not pass this test.
    allowed_one = {"apply --all": sent_by_all(SENT["apply --all"])}
    answers = allowed(rule, tmp_path, {**allowed_one, **NOT_FOR_THE_RULE})
    assert [name for name, ok in answers.items() if ok] == ["apply --all"], answers

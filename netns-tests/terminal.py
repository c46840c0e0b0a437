"""A real terminal for the netns tests: tmux, whose screen a test reads as a
person would see it."""

import shlex
import subprocess

from lbctl.errors import LabError


class Tmux:
    """A real terminal: the test reads the screen as a person would see it."""

    def __init__(self, socket_name):
        """`socket_name`: a tmux server of the test's own, so that tests
        running at once in other modules never share one."""
        self.base = ["tmux", "-L", socket_name]
        # A server left by a run that was killed would refuse the sessions.
        subprocess.run(self.base + ["kill-server"], capture_output=True, check=False)
        # A session that stays, and panes that stay after their command ends,
        # so the screen can be read once lbctl has left it.
        subprocess.run(self.base + ["new-session", "-d", "-s", "keep"], check=True)
        subprocess.run(self.base + ["set-option", "-g", "remain-on-exit", "on"], check=True)

    def start(self, argv, width=120, height=32):
        subprocess.run(self.base + ["new-session", "-d", "-s", "watch", "-x", str(width),
                                    "-y", str(height), shlex.join(argv)], check=True)

    def screen(self):
        return subprocess.run(self.base + ["capture-pane", "-p", "-t", "watch"], check=True,
                              capture_output=True, text=True).stdout

    def show(self, what):
        return subprocess.run(self.base + ["display-message", "-p", "-t", "watch", what],
                              check=True, capture_output=True, text=True).stdout.strip()

    def wait_for(self, lab, predicate, timeout, what):
        """lab.wait_for on the screen; a timeout shows the screen as it was."""
        try:
            lab.wait_for(lambda: predicate(self.screen()), timeout=timeout, what=what)
        except LabError as exc:
            raise LabError(f"{exc}; the screen:\n{self.screen()}") from None

    def keys(self, *keys):
        subprocess.run(self.base + ["send-keys", "-t", "watch", *keys], check=True)

    def close(self):
        subprocess.run(self.base + ["kill-server"], check=False)

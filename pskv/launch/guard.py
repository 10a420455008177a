"""The guard around each process of a job: it ends the process when the launcher is gone.

``python -S guard.py MODE GRACE LATER -- COMMAND...`` runs COMMAND in the guard's
process group and exits as COMMAND did (its code, or dying of the same signal). Its
stdin is the launcher's lifeline, a pipe nobody writes to: end of file means the
launcher closed it or died (SIGKILL included), locally or at the far end of an ssh
connection. Then:

* ``worker`` mode: SIGTERM to the group at once, SIGKILL after GRACE seconds;
* ``role`` mode (scheduler, server): SIGUSR1 to COMMAND every quarter second —
  ``pskv.roles`` takes it for "no worker will come or stay" and ends with exit 0 — and
  SIGTERM / SIGKILL only if it is still there LATER (then GRACE) seconds on. The launcher
  closes the lifeline of the roles itself once every worker has exited 0, so a job
  whose workers never created a store ends at once. COMMAND starts with SIGUSR1
  ignored, so a signal sent before it is ready is lost, not fatal (the next one counts).

Signals to the guard itself do not kill it (the launcher signals the whole group, so
COMMAND gets them directly). Standard library only, run with ``-S``: it starts in a few
milliseconds and needs nothing installed where it runs (the ssh launcher passes this
file's text with ``-c``).
"""

import os
import select
import signal
import stat
import subprocess
import sys
import threading


def _lifeline_closed() -> bool:
    """Block until stdin's pipe has no writer left; False if stdin is no pipe (nothing to watch)."""
    try:
        if not stat.S_ISFIFO(os.fstat(0).st_mode):
            return False
        poller = select.poll()
        poller.register(0, 0)  # no events asked: only a hang-up (or an error) wakes it
        while True:
            for _, event in poller.poll():
                if event & (select.POLLHUP | select.POLLERR | select.POLLNVAL):
                    return True
    except OSError:
        return False


def _signal_group(signum: int) -> None:
    try:
        os.killpg(0, signum)
    except OSError:
        pass


def _watch(child: "subprocess.Popen[bytes]", mode: str, grace: float, later: float) -> None:
    if not _lifeline_closed():
        return
    if mode == "role":
        for _ in range(max(1, int(later * 4))):
            try:
                child.send_signal(signal.SIGUSR1)
                child.wait(0.25)
                return
            except subprocess.TimeoutExpired:
                continue
    _signal_group(signal.SIGTERM)
    try:
        child.wait(grace)
        return
    except subprocess.TimeoutExpired:
        _signal_group(signal.SIGKILL)


def _exit_as(returncode: int) -> None:
    if returncode >= 0:
        sys.exit(returncode)
    signum = -returncode
    try:
        import resource
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # the child dumped core already, if it did
    except (ImportError, OSError, ValueError):
        pass
    try:
        signal.signal(signum, signal.SIG_DFL)
    except (OSError, ValueError):  # SIGKILL, SIGSTOP: no handler to reset
        pass
    os.kill(os.getpid(), signum)
    sys.exit(128 + signum)  # a signal that does not kill (it should not come to this)


def main(argv: list[str]) -> None:
    """``MODE GRACE LATER -- COMMAND...``: see the module doc."""
    if len(argv) < 5 or argv[0] not in ("worker", "role") or argv[3] != "--":
        sys.exit("usage: guard.py worker|role GRACE LATER -- COMMAND [ARG ...]")
    mode, grace, later, command = argv[0], float(argv[1]), float(argv[2]), argv[4:]
    try:
        os.setpgid(0, 0)  # a group of its own (over ssh); the launcher made it a session leader locally
    except OSError:
        pass
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, lambda *_: None)  # a handler, not SIG_IGN: COMMAND gets the defaults
    if mode == "role":
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # inherited: COMMAND ignores it until it is ready
    try:
        child = subprocess.Popen(command, stdin=subprocess.DEVNULL)
    except OSError as exc:
        print(f"pskv guard: cannot run {command[0]}: {exc}", file=sys.stderr, flush=True)
        sys.exit(127 if isinstance(exc, FileNotFoundError) else 126)
    threading.Thread(target=_watch, args=(child, mode, grace, later), daemon=True).start()
    _exit_as(child.wait())


if __name__ == "__main__":
    main(sys.argv[1:])

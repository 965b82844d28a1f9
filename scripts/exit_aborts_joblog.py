"""pytest plugin: log every subprocess the suite starts (argv, working directory, the
environment it changed, exit status, whether its output held torch's abort at exit) as JSON
lines, for scripts/exit_aborts.py to replay:

    EXIT_ABORTS_LOG=/tmp/jobs.jsonl PYTHONPATH=scripts python -m pytest -p exit_aborts_joblog \\
        --basetemp=/tmp/suite-base -m "not slow"
    python scripts/exit_aborts.py --jobs /tmp/jobs.jsonl --base /tmp/suite-base --reps 10

Only processes whose output is read through ``communicate()`` (``subprocess.run`` with
captured output, which every job runner of tests/conftest.py uses) are logged.
"""

import json
import os
import subprocess
import time

LOG = os.environ.get("EXIT_ABORTS_LOG", "exit-aborts-jobs.jsonl")
ABORT = "terminate called without an active exception"
_init = subprocess.Popen.__init__
_communicate = subprocess.Popen.communicate
_base_env = dict(os.environ)


def _text(b) -> str:
    if b is None:
        return ""
    return b if isinstance(b, str) else b.decode("utf-8", "replace")


def _logged_init(self, args, *a, **kw):
    env = kw.get("env")
    self._exit_aborts = {
        "args": [str(x) for x in args] if isinstance(args, (list, tuple)) else str(args),
        "cwd": str(kw.get("cwd") or os.getcwd()),
        "env": {k: v for k, v in env.items() if _base_env.get(k) != v} if env else {},
        "t0": time.time(), "test": os.environ.get("PYTEST_CURRENT_TEST", "")}
    _init(self, args, *a, **kw)


def _logged_communicate(self, *a, **kw):
    out, err = _communicate(self, *a, **kw)
    h = getattr(self, "_exit_aborts", None)
    if h is not None and not h.get("done"):
        h["done"] = True
        h.update(rc=self.returncode, dt=round(time.time() - h["t0"], 2),
                 abort=ABORT in _text(err) or ABORT in _text(out))
        with open(LOG, "a") as f:
            f.write(json.dumps(h) + "\n")
    return out, err


subprocess.Popen.__init__ = _logged_init
subprocess.Popen.communicate = _logged_communicate

"""Count torch's aborts at interpreter exit in the jobs the test suites launch, plain and traced.

Torch 2.13's gloo jobs can end, after all their work, with "terminate called without an active
exception" (SIGABRT at interpreter exit, pytorch/pytorch#179291; docs/faq.md). This replays jobs
many times, each both without commtrace ("plain") and under ``commtrace run`` ("traced"), and
counts per job and mode: runs, non-zero exits, and exits whose output holds torch's abort line.

Jobs come from a JSON-lines file of logged commands (``--jobs``; one object per line with
"args", "cwd", "env" and optionally "base": the directory prefix of the test's temporary paths,
rewritten to a fresh directory per run), or from the built-in list (the samples, the demo's job
and the wheel smoke's DDP job; ``--builtin``). A logged ``commtrace run -o DIR [opts] -- CMD``
is replayed as CMD (plain) and as itself (traced); any other command as itself (plain) and
under ``commtrace run -o DIR --`` (traced).

    python scripts/exit_aborts.py --builtin --reps 10 [--only ddp_mlp] [--json out.json]

Nothing here retries: every run counts.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ABORT = "terminate called without an active exception"
PY = sys.executable
TORCHRUN = [PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]

#: name -> argv ({out}: a fresh directory per run). The jobs a user meets first.
BUILTIN = {
    "ddp_mlp": TORCHRUN + ["samples/ddp_mlp.py", "--steps", "6"],
    "fsdp2": TORCHRUN + ["samples/fsdp2.py"],
    "pipeline": TORCHRUN + ["samples/pipeline.py"],
    "all_collectives": TORCHRUN + ["samples/all_collectives.py"],
    "funcol_all": TORCHRUN + ["tests/scripts/funcol_all.py", "{out}/funcol.json"],
    "ddp_logging": TORCHRUN + ["tests/scripts/ddp_logging.py", "{out}/ddp.json"],
}


def split_traced(args: list[str]) -> tuple[list[str] | None, list[str]]:
    """(commtrace's part up to ``--``, the job) of a logged command; (None, args) when the
    command is not ``commtrace run``."""
    if len(args) > 3 and args[1:4] == ["-m", "commtrace", "run"] and "--" in args:
        i = args.index("--")
        return args[:i + 1], args[i + 1:]
    return None, args


def load_jobs(path: str, only: str | None, default_base: str | None) -> dict[str, dict]:
    """name -> {"plain": argv, "traced": argv, "env": {...}, "base": prefix or None} for the
    logged commands that start a training job (torchrun, a tests/scripts or samples script)."""
    jobs: dict[str, dict] = {}
    with open(path) as f:
        for line in f:
            d = json.loads(line)
            args = d["args"]
            if not isinstance(args, list):
                continue
            ct, job = split_traced(args)
            script = next((a for a in job if re.search(r"(tests/scripts|samples)/[\w.]+\.py$", a)
                           or a.endswith(("train.py", "ddp_cxx.py"))), None)
            if script is None or "torch.distributed.run" not in " ".join(job) and \
                    "tests/scripts" not in script:
                continue
            base = d.get("base") or default_base
            rest = ["T" if base and x.startswith(base) else x for x in job[job.index(script) + 1:]]
            rest += [f"{k}={v}" for k, v in sorted((d.get("env") or {}).items())
                     if k.startswith("COMMTRACE_") and k != "COMMTRACE_CACHE_DIR"]
            opts = [x for x in (ct or [])[5:-1] if not (base and x.startswith(base))]
            key = " ".join([os.path.basename(script)[:-3]] + rest)[:80]
            if ct:
                key += " [traced" + (" " + " ".join(opts) if opts else "") + "]"
            if only and not re.search(only, key):
                continue
            jobs.setdefault(key, {"job": job, "opts": ct, "env": d.get("env") or {},
                                  "base": base, "cwd": d.get("cwd") or ROOT})
    return jobs


def rewrite(argv: list[str], base: str | None, new: str) -> list[str]:
    if not base:
        return argv
    return [a.replace(base, new) for a in argv]


def rebase(job: dict, repo: str | None) -> dict:
    """`job` with the logged repository's paths pointing at this one (ROOT)."""
    if not repo or os.path.abspath(repo) == ROOT:
        return job
    def sub(v):   # the repository's files, not its virtual environment
        if not isinstance(v, str) or os.sep + ".venv" + os.sep in v:
            return v
        return v.replace(repo, ROOT)

    return dict(job, job=[sub(a) for a in job["job"]],
                opts=[sub(a) for a in job["opts"]] if job["opts"] else job["opts"],
                env={k: sub(v) for k, v in job["env"].items()}, cwd=sub(job["cwd"]))


def run_once(argv: list[str], env: dict, cwd: str, timeout: float) -> dict:
    t0 = time.time()
    try:
        p = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True,
                           timeout=timeout)
        rc, out = p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired as e:
        rc, out = "timeout", (e.stdout or b"").decode() + (e.stderr or b"").decode() \
            if isinstance(e.stdout, bytes) else str(e.stdout or "") + str(e.stderr or "")
    return {"rc": rc, "abort": ABORT in out, "s": round(time.time() - t0, 1),
            "tail": out[-1500:] if rc != 0 else ""}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", help="JSON-lines file of logged commands")
    ap.add_argument("--builtin", action="store_true", help="the built-in job list")
    ap.add_argument("--base", help="the temporary-path prefix of the logged commands")
    ap.add_argument("--repo", help="the repository the logged commands ran in (rewritten to "
                    "this script's)")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--only", help="regular expression on the job names")
    ap.add_argument("--modes", default="plain,traced")
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--json", help="write every run's result here")
    a = ap.parse_args(argv)
    if a.builtin:
        jobs = {k: {"job": v, "opts": None, "env": {}, "base": None, "cwd": ROOT}
                for k, v in BUILTIN.items() if not a.only or re.search(a.only, k)}
    elif a.jobs:
        jobs = {k: rebase(v, a.repo) for k, v in load_jobs(a.jobs, a.only, a.base).items()}
    else:
        ap.error("--jobs FILE or --builtin")
    env0 = {k: v for k, v in os.environ.items() if not k.startswith("COMMTRACE_")}
    env0.update(PYTHONPATH=ROOT, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
                MASTER_ADDR="127.0.0.1")
    results = []
    modes = a.modes.split(",")
    print(f"{len(jobs)} jobs x {a.reps} reps x {modes}; load {os.getloadavg()}", flush=True)
    for name, j in jobs.items():
        counts = {}
        for mode in modes:
            n_fail = n_abort = 0
            for rep in range(a.reps):
                tmp = tempfile.mkdtemp(prefix="exit-aborts-")
                try:
                    base = j["base"]
                    job = [x.replace("{out}", tmp) for x in rewrite(j["job"], base, tmp)]
                    for x in job:   # the parents of the test's paths
                        if x.startswith(tmp):
                            os.makedirs(os.path.dirname(x), exist_ok=True)
                    if mode == "traced":
                        if j["opts"]:
                            ct = rewrite(j["opts"], base, tmp)
                            ct = [PY] + ct[1:]
                        else:
                            ct = [PY, "-m", "commtrace", "run", "-o", os.path.join(tmp, "ct"),
                                  "--"]
                        cmd = ct + job
                    else:
                        cmd = job
                    env = dict(env0)
                    env.update({k: rewrite([v], base, tmp)[0] for k, v in j["env"].items()
                                if k != "PYTEST_CURRENT_TEST"})
                    r = run_once(cmd, env, j["cwd"], a.timeout)
                finally:
                    shutil.rmtree(tmp, ignore_errors=True)
                r.update(job=name, mode=mode, rep=rep)
                results.append(r)
                n_fail += r["rc"] != 0
                n_abort += r["abort"]
                if r["rc"] != 0:
                    print(f"  {name} {mode} rep {rep}: rc={r['rc']} abort={r['abort']}\n"
                          + "    " + r["tail"][-600:].replace("\n", "\n    "), flush=True)
            counts[mode] = (n_fail, n_abort)
        print(f"{name}: " + "; ".join(f"{m} {f} failed, {ab} aborts at exit in {a.reps}"
                                      for m, (f, ab) in counts.items())
              + f"  (load {os.getloadavg()[0]:.1f})", flush=True)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(results, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())

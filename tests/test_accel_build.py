"""`commtrace accel build` after a build that was killed (pytest's timeout, a Ctrl-C, an OOM
kill): torch's build baton (a ``lock`` file) stays behind, and a link stopped half way can
leave a truncated module. Before, every later build waited on that file for ever; now the
build holds a kernel lock (released with its process), clears both, and relinks."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from conftest import clean_env


def test_a_module_without_the_marker_is_not_built(tmp_path, monkeypatch):
    from commtrace.capture import accel

    monkeypatch.setenv("COMMTRACE_CACHE_DIR", str(tmp_path))
    d = tmp_path / "commtrace_ddp_hook_0123"
    d.mkdir()
    (d / "commtrace_ddp_hook_0123.so").write_bytes(b"\x7fELF cut short")
    assert accel._built_file("commtrace_ddp_hook_0123") is None
    (d / accel.MARKER).write_text("commtrace_ddp_hook_0123.so\n")
    assert accel._built_file("commtrace_ddp_hook_0123") == str(d / "commtrace_ddp_hook_0123.so")
    (d / accel.MARKER).write_text("elsewhere.so\n")  # names a file that is not there
    assert accel._built_file("commtrace_ddp_hook_0123") is None


def test_build_after_a_killed_build_clears_the_stale_lock_and_relinks(tmp_path, accel_cache):
    """A copy of this session's real build, made to look killed during its link: torch's
    baton file present, the module truncated, no marker. `accel build` finishes (it waited
    for ever before), relinks a loadable module, and writes the marker."""
    from commtrace.capture import accel
    name = accel.module_name()
    cache = tmp_path / "cache"
    shutil.copytree(os.path.join(accel_cache, name), cache / name)
    bdir = cache / name
    os.remove(bdir / accel.MARKER)
    [so] = [f for f in os.listdir(bdir) if f.endswith(".so")]
    size = os.path.getsize(bdir / so)
    with open(bdir / so, "r+b") as f:
        f.truncate(4096)
    (bdir / "lock").write_text("")
    p = subprocess.run([sys.executable, "-m", "commtrace", "accel", "build"],
                       env=clean_env({"COMMTRACE_CACHE_DIR": str(cache)}), capture_output=True,
                       text=True, timeout=1200)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert not (bdir / "lock").exists()
    assert (bdir / accel.MARKER).read_text().strip() == so
    assert os.path.getsize(bdir / so) == size
    q = subprocess.run([sys.executable, "-m", "commtrace", "accel", "status"],
                       env=clean_env({"COMMTRACE_CACHE_DIR": str(cache)}), capture_output=True, text=True)
    assert q.returncode == 0 and str(bdir / so) in q.stdout, q.stdout + q.stderr


def test_asking_before_torch_is_imported_does_not_hide_the_module(accel_cache):
    """accel.load() before `import torch` (a benchmark's or a tool's early check) is None, but
    that answer is not kept: once torch is imported the built module loads (session 25: the
    first answer was cached, and the process never loaded the module)."""
    code = ("import sys\n"
            "from commtrace.capture import accel\n"
            "assert 'torch' not in sys.modules\n"
            "before = accel.load()\n"
            "import torch\n"
            "after = accel.load()\n"
            "print(before is None, after is not None, getattr(after, '__name__', '') == accel.module_name())\n")
    p = subprocess.run([sys.executable, "-c", code], env=clean_env({"COMMTRACE_CACHE_DIR": accel_cache}),
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.split() == ["True", "True", "True"], p.stdout + p.stderr

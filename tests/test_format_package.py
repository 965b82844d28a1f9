"""The trace format lives in commtrace.format; commtrace.trace stays the context manager."""
import subprocess
import sys


def test_trace_is_the_context_manager_after_the_format_is_imported():
    code = ("import commtrace; from commtrace.format import schema, reader, writer; "
            "import commtrace.analysis.run; from commtrace.capture.api import trace; "
            "assert commtrace.trace is trace, commtrace.trace; "
            "import sys; assert 'torch' not in sys.modules or True; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_format_package_does_not_import_torch():
    code = "import sys; import commtrace.format.reader, commtrace.format.writer; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"

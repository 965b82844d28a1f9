"""`commtrace dashboard DIR`: serve the interactive dashboard of one run (docs/dashboard.md)."""

from __future__ import annotations

import ipaddress
import os
import socket
import sys
import threading
import webbrowser

import click

from ..errors import CommtraceError, TraceFormatError

EPILOG = """\b
Examples:
  commtrace dashboard commtrace-traces/<run>
  commtrace dashboard RUN --port 8051 --no-browser
  commtrace dashboard RUN --host 0.0.0.0      # reachable from other machines (warns)
  commtrace dashboard traces/good --compare traces/bad   # two runs side by side
"""


class ServeError(CommtraceError):
    """The dashboard's server could not start (port taken, bad host)."""


def is_loopback(host: str) -> bool:
    """True when `host` only accepts connections from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@click.command("dashboard", epilog=EPILOG)
@click.argument("run_dir", metavar="DIR", type=click.Path())
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind (loopback unless told).")
@click.option("--port", type=click.IntRange(0, 65535), default=8050, show_default=True)
@click.option("--no-browser", is_flag=True, help="Do not open a web browser.")
@click.option("--compare", "compare_dir", metavar="DIR_B", type=click.Path(), default=None,
              help="A second run to compare with DIR (Compare page: the diff's deltas, both overviews).")
@click.option("--run", "run_id", default=None, metavar="ID|latest",
              help="When DIR holds several runs: the one to use (its id, or latest).")
def command(run_dir, host, port, no_browser, compare_dir, run_id):
    """Serve the interactive dashboard of a run: overview, timeline, overlap, stalls, findings,
    bandwidth, run facts. On a running job it refreshes on its own (live strip, hang banner).

    Serves only the run DIR (and DIR_B with --compare); stop it with Ctrl-C."""
    from ..analysis.run import load

    for d in (run_dir, compare_dir):
        if d is None:
            continue
        if not os.path.exists(d):
            raise TraceFormatError(f"{d}: no such run directory")
        if not os.access(d, os.R_OK):
            raise TraceFormatError(f"{d}: not readable")
    if not is_loopback(host):
        click.echo(f"commtrace: warning: serving on {host}, reachable from other machines; "
                   "the dashboard has no authentication", err=True)
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, port))
    except OSError as e:
        raise ServeError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    click.echo(f"loading {run_dir} ...", err=True)
    run = load(run_dir, run=run_id)
    if run.missing_ranks:
        click.echo(f"commtrace: warning: partial run, rank(s) {', '.join(map(str, run.missing_ranks))} missing", err=True)
    other = None
    if compare_dir is not None:
        click.echo(f"loading {compare_dir} ...", err=True)
        other = load(compare_dir)
    from ..dashboard.app import build
    from ..dashboard.serve import serve_forever

    app = build(run, compare=other)

    def ready(url):
        # commtrace's one line instead of Flask's development-server banner; no per-request log.
        click.echo(f"commtrace dashboard of {run_dir}: serving on {url}, Ctrl-C to stop", err=False)
        if not no_browser:
            threading.Timer(1.0, lambda: webbrowser.open(url)).start()

    try:
        serve_forever(app, host, port, on_ready=ready)
    except KeyboardInterrupt:
        # Ctrl-C: leave now, with the shell's 130. Exiting normally would first wait for the
        # app's background figure builds (non-daemon worker threads), which takes seconds to
        # minutes on a large run or a loaded machine; a server has nothing left to write.
        click.echo("", err=True)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)
    except OSError as e:
        raise ServeError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    return 0

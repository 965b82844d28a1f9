"""Serve a Dash app: werkzeug's threaded server bound to one address, without Flask's
development-server banner and without one access-log line per HTTP request (errors still log).
`Server` runs it from a background thread (tests, benchmark); `serve_forever` in the caller's
thread (`commtrace dashboard`)."""

from __future__ import annotations

import socketserver
import threading

from werkzeug.serving import WSGIRequestHandler, make_server


class QuietRequestHandler(WSGIRequestHandler):
    """werkzeug's handler minus the per-request access log line."""

    def log_request(self, code="-", size="-"):
        pass


def make_quiet_server(app, host: str, port: int):
    """A threaded werkzeug server for the Dash `app`, logging no requests."""
    return make_server(host, port, app.server, threaded=True, request_handler=QuietRequestHandler)


def serve_forever(app, host: str, port: int, on_ready=None) -> None:
    """Serve `app` until KeyboardInterrupt, which propagates; `on_ready(url)` is called once it
    listens. (werkzeug's own serve_forever swallows KeyboardInterrupt: Ctrl-C would exit 0.)"""
    srv = make_quiet_server(app, host, port)
    url = f"http://{'[' + host + ']' if ':' in host else host}:{srv.server_port}/"
    if on_ready is not None:
        on_ready(url)
    try:
        socketserver.BaseServer.serve_forever(srv)
    finally:
        srv.server_close()


class Server:
    """`Server(app, port=0)` listens on 127.0.0.1 (port 0 = any free one) until `stop()`."""

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0):
        self._srv = make_quiet_server(app, host, port)
        self.host, self.port = host, self._srv.server_port
        self.url = f"http://{host}:{self.port}/"
        self._thread = threading.Thread(target=self._srv.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._srv.shutdown()
        self._thread.join(timeout=10)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

"""Serve a Dash app from a background thread (tests, benchmark): werkzeug's threaded server,
bound to one address, with a clean shutdown."""

from __future__ import annotations

import threading

from werkzeug.serving import make_server


class Server:
    """`Server(app, port=0)` listens on 127.0.0.1 (port 0 = any free one) until `stop()`."""

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0):
        self._srv = make_server(host, port, app.server, threaded=True)
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

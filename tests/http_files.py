"""A real HTTP server on 127.0.0.1 for download tests (no mocks of the downloader).

``serve(files)`` starts ``http.server`` in a thread and yields a :class:`Server` whose ``url`` is the
base to put in ``$DFBENCH_MIRROR``. ``files`` maps a file name to its bytes; ``Server.truncate``
names files whose response announces the full Content-Length but closes after half the body
(an interrupted transfer). Every GET is logged in ``Server.requests``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Server:
    url: str
    files: dict[str, bytes]
    requests: list[str] = field(default_factory=list)
    truncate: set[str] = field(default_factory=set)


@contextmanager
def serve(files: dict[str, bytes]) -> Iterator[Server]:
    state = Server(url="", files=dict(files))

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            name = self.path.lstrip("/")
            state.requests.append(name)
            body = state.files.get(name)
            if body is None:
                self.send_error(404, "no such file")
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Content-Type", "application/octet-stream")
            self.end_headers()
            if name in state.truncate:
                self.wfile.write(body[: len(body) // 2])
                self.wfile.flush()
                self.close_connection = True
                return
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:  # keep test output quiet
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.url = f"http://127.0.0.1:{httpd.server_address[1]}/"
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)

"""Running the app under uvicorn: in the foreground (the command, Ctrl-C and SIGTERM drain), or
in a background thread (tests, scripts). The socket is bound first, so port 0 picks a free one
and the address is known before the first request."""

from __future__ import annotations

import ipaddress
import logging
import signal
import socket
import sys
import threading
import time

import uvicorn

from macspec.errors import MacspecError
from macspec.serve.app import make_app
from macspec.serve.backend import Backend
from macspec.serve.served import OneModel, Served

DRAIN_S = 60
"""On Ctrl-C or SIGTERM: how long requests in flight (and queued) may take to finish."""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name other than localhost may resolve anywhere
        return False


def check_host(host: str, api_key: str | None, insecure: bool) -> None:
    """A host other than the loopback serves the network: it needs a key, or --insecure."""
    if not is_loopback(host) and api_key is None and not insecure:
        raise MacspecError(
            f"--host {host} exposes the server beyond this machine: pass --api-key KEY "
            "(clients then send it as a bearer token), or --insecure to serve without one"
        )


def bind(host: str, port: int) -> socket.socket:
    """A listening socket, or a one-line error (port taken, bad address)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise MacspecError(f"--host {host}: {exc.strerror}") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise MacspecError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


class DrainingServer(uvicorn.Server):
    """uvicorn's server, saying what a stop waits for. The first Ctrl-C (or SIGTERM) stops
    accepting and lets the answers in flight finish; the second cancels them, so each ends at
    once as 'cancelled' and the shutdown completes cleanly; only a third forces uvicorn out."""

    def __init__(self, config: uvicorn.Config, models: Served):
        super().__init__(config)
        self.models = models
        self.signals = 0

    def handle_exit(self, sig: int, frame) -> None:
        self.signals += 1
        workers = self.models.workers()
        if self.signals == 1:
            busy = sum(worker.generating + worker.waiting for worker in workers)
            if busy:
                answers = "answer" if busy == 1 else "answers"
                limit = self.config.timeout_graceful_shutdown
                print(f"macspec: stopping: finishing {busy} {answers} in flight (up to "
                      f"{limit:.0f} s; Ctrl-C again cuts them short)",
                      file=sys.stderr, flush=True)  # fmt: skip
        elif self.signals == 2:
            print("macspec: stopping now: cutting short the answers in flight", file=sys.stderr,
                  flush=True)  # fmt: skip
            for worker in workers:
                worker.cancel_all()
            self._captured_signals.append(sig)
            return
        super().handle_exit(sig, frame)


def make_server(served: Backend | Served, api_key: str | None, drain_s: float = DRAIN_S):
    """uvicorn's server over the app serving one backend, or a pool of models."""
    models = OneModel(served) if isinstance(served, Backend) else served
    config = uvicorn.Config(
        make_app(models, api_key),
        log_config=None,  # our own one line per request instead of uvicorn's access log
        access_log=False,
        timeout_graceful_shutdown=drain_s,
        lifespan="on",
    )
    return DrainingServer(config, models)


def setup_logging() -> None:
    """One line per request on stderr, timestamped (and the prompt cache's lines, and a failed
    drafter's traceback)."""
    for name in ("macspec.serve", "macspec.prefix", "macspec.engine"):
        logger = logging.getLogger(name)
        if not logger.handlers:
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
            logger.addHandler(handler)
        logger.setLevel(logging.INFO)


class _Stopped(Exception):
    """SIGTERM, raised again by uvicorn once it has drained."""


def _stopped(_signum, _frame) -> None:
    raise _Stopped()


def run_server(
    served: Backend | Served, sock: socket.socket, host: str, api_key: str | None, announce=print
) -> None:
    """Serve on `sock` (bound by `bind` before the model loaded, so a taken port is known
    at once) until Ctrl-C or SIGTERM, then drain: uvicorn stops accepting connections and
    waits for the requests in flight (and queued) to finish, up to DRAIN_S."""
    setup_logging()
    server = make_server(served, api_key)
    if isinstance(served, Backend):
        # A worker that can no longer generate (a lost rank) stops the server as Ctrl-C would,
        # without a signal: a second one (mlx.launch's SIGTERM) would not then force the exit.
        served.worker.on_fatal = lambda _exc: setattr(server, "should_exit", True)
    shown = f"[{host}]" if ":" in host else host
    announce(f"http://{shown}:{sock.getsockname()[1]}/v1")
    # uvicorn re-raises the signal that stopped it once it has drained: end quietly then.
    previous = signal.signal(signal.SIGTERM, _stopped)
    try:
        server.run(sockets=[sock])
    except (KeyboardInterrupt, _Stopped):
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        sock.close()


class ServerThread:
    """The server on a free localhost port in a background thread (tests, scripts)."""

    def __init__(
        self, backend: Backend | Served, api_key: str | None = None, host: str = "127.0.0.1"
    ):
        self.backend = backend
        self.sock = bind(host, 0)
        self.port = self.sock.getsockname()[1]
        self.base_url = f"http://{host}:{self.port}/v1"
        self.server = make_server(backend, api_key, drain_s=5)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )

    def __enter__(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(15)
        self.sock.close()

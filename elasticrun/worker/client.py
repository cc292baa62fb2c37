"""Blocking HTTP client for the driver's server (stdlib only: it runs inside training processes).

Every request is signed (protocol.sign_headers). One keep-alive connection per thread,
because Gloo and the notice watcher call in from different threads. Every call is
bounded: connection problems are retried for at most `unreachable_timeout` seconds.
"""

from __future__ import annotations

import http.client
import json
import os
import threading
import time
from typing import Any

from elasticrun import protocol


class DriverUnreachableError(ConnectionError):
    """The driver did not answer for longer than the allowed time."""


class StaleDriverError(http.client.HTTPException):
    """An answer from a driver older (lower epoch) than one this worker has heard: a
    driver that was stopped or cut off and came back after another took over. Never obeyed;
    retried like an unreachable driver, so the worker keeps waiting for the current one."""


class RequestRefusedError(RuntimeError):
    """The driver answered with an error status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"driver refused the request ({status}): {message}")
        self.status = status


class DriverClient:
    def __init__(
        self, host: str, port: int, secret: str,
        unreachable_timeout: float = protocol.DEFAULT_DRIVER_TIMEOUT_S,
    ) -> None:
        self._host = host
        self._port = port
        self._secret = secret
        self._unreachable_timeout = unreachable_timeout
        self._local = threading.local()
        self.epoch = 0  # the newest driver epoch heard (0: none yet)
        self._epoch_lock = threading.Lock()

    @classmethod
    def from_env(cls) -> DriverClient:
        env = os.environ
        return cls(
            env[protocol.ENV_RENDEZVOUS_ADDR],
            int(env[protocol.ENV_RENDEZVOUS_PORT]),
            env[protocol.ENV_SECRET],
            float(env.get(protocol.ENV_DRIVER_TIMEOUT, protocol.DEFAULT_DRIVER_TIMEOUT_S)),
        )

    @property
    def unreachable_timeout(self) -> float:
        return self._unreachable_timeout

    def bounded(self, unreachable_timeout: float) -> DriverClient:
        """A client of the same driver that gives up sooner (a report at exit)."""
        return DriverClient(self._host, self._port, self._secret, unreachable_timeout)

    def call(self, path: str, payload: dict[str, Any], wait: float = 0.0) -> dict[str, Any]:
        """POSTs `payload` to `path`; `wait` is how long the server may hold the request."""
        body = json.dumps(payload).encode()
        give_up = time.monotonic() + self._unreachable_timeout
        delay = 0.05
        while True:
            try:
                return self._post(path, body, wait)
            except (OSError, http.client.HTTPException) as exc:
                self._drop_connection()
                if time.monotonic() + delay > give_up:
                    raise DriverUnreachableError(
                        f"elasticrun driver at {self._host}:{self._port} unreachable for "
                        f"{self._unreachable_timeout:g}s: {exc}") from None
                time.sleep(delay)
                delay = min(delay * 2, 1.0)

    def _post(self, path: str, body: bytes, wait: float) -> dict[str, Any]:
        conn = self._connection(wait)
        headers = protocol.sign_headers(self._secret, "POST", path, body)
        headers["Content-Type"] = "application/json"
        if self.epoch:
            headers[protocol.HEADER_EPOCH] = str(self.epoch)  # fences off an older driver
        conn.request("POST", path, body=body, headers=headers)
        response = conn.getresponse()
        data = response.read()
        self._check_epoch(response.getheader(protocol.HEADER_EPOCH))
        if response.status != 200:
            try:
                message = json.loads(data).get("error", "")
            except ValueError:
                message = data[:200].decode(errors="replace")
            raise RequestRefusedError(response.status, message)
        result = json.loads(data)
        assert isinstance(result, dict)
        return result

    def _check_epoch(self, header: str | None) -> None:
        """Raises StaleDriverError for an answer below the newest epoch heard. An answer
        without one (an error raised past the server's gate) says nothing either way."""
        if header is None or not header.isdigit():
            return
        epoch = int(header)
        with self._epoch_lock:  # the training thread and the notice watcher both call
            if epoch < self.epoch:
                raise StaleDriverError(f"an older driver answered (epoch {epoch}; this worker "
                                       f"has heard epoch {self.epoch})")
            self.epoch = epoch

    def _connection(self, wait: float) -> http.client.HTTPConnection:
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = http.client.HTTPConnection(self._host, self._port)
            self._local.conn = conn
        # A driver that accepts but never answers (stopped, hung) counts as unreachable too.
        conn.timeout = wait + min(15.0, self._unreachable_timeout)
        if conn.sock is not None:
            conn.sock.settimeout(conn.timeout)
        return conn

    def _drop_connection(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    def close(self) -> None:
        self._drop_connection()

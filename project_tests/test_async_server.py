# Owner(s): ["module: autograd"]
"""Grad-mode decorators in a real async server: ``examples/async_server.py`` under load.

The example is a FastAPI app on uvicorn.  Its ``POST /predict`` endpoint is an
``@torch.inference_mode()`` ``async def``, its ``GET /stream`` endpoint streams
from an ``@torch.inference_mode()`` async generator, and a background task on
the same event loop trains another model with autograd across its own awaits.
These tests start the real server as a subprocess on 127.0.0.1, send it
concurrent requests with ``httpx.AsyncClient`` so that the requests and the
trainer interleave at every ``await``, and check what the server reports:

* every step of every ``/predict`` ran in inference mode and computed
  inference tensors, and the values are the model's;
* every ``/stream`` is complete, and each of its lines was computed in
  inference mode as an inference tensor;
* the trainer ran, never saw grad mode off or inference mode on, and every
  gradient was the analytic one.

On stock torch 2.13.0 (``TORCH_GRADMODE_OVERLAY=0``, which the server
inherits) the decorators do not reach the async bodies, so the endpoint checks
fail.  Everything is bounded: the server start-up, each request, each batch of
requests and the server's shutdown.
"""

import asyncio
import importlib.util
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import unittest

import torch
from torch.testing._internal.common_utils import run_tests, TestCase

try:
    import fastapi  # noqa: F401
    import httpx
    import uvicorn  # noqa: F401
except ImportError:
    HAS_SERVER_DEPS = False
else:
    HAS_SERVER_DEPS = True

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SERVER = os.path.join(REPO, "examples", "async_server.py")
HOST = "127.0.0.1"

START_ATTEMPTS = 3  # a fresh port each time, in case another process took the last one
START_TIMEOUT = 90.0  # seconds for all attempts together; importing torch is most of it
STOP_TIMEOUT = 10.0  # seconds to wait after SIGTERM before SIGKILL
REQUEST_TIMEOUT = 20.0  # seconds for one request
LOAD_TIMEOUT = 60.0  # seconds for one batch of concurrent requests
TRAINING_TIMEOUT = 20.0  # seconds to wait for the trainer to make progress

N_PREDICT = 20
N_STREAM = 5
STREAM_LINES = 10


def free_port():
    """Return a TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def load_example():
    """Import ``examples/async_server.py`` as a module, to rebuild its model here."""
    spec = importlib.util.spec_from_file_location("_async_server_example", SERVER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def predict_input(i):
    """Return the input vector of the ``i``-th concurrent ``/predict`` request."""
    return [float(i), 1.0 - i, 0.5 * i, -2.0 + 0.25 * i]


class ServerProcess:
    """``examples/async_server.py`` running in a subprocess on a free port of 127.0.0.1.

    :meth:`launch` returns at once, so the caller can do other work while the
    server imports torch; :meth:`ready` waits, within ``START_TIMEOUT`` in all,
    until it answers, relaunching on a fresh port (at most ``START_ATTEMPTS``
    launches) if it died, e.g. because another process took its port.
    """

    def __init__(self):
        self.proc = None
        self.port = None
        self.log = tempfile.TemporaryFile(mode="w+b")
        self.deadline = None
        self.attempts = 0
        self.health = None
        self.failure = None

    @property
    def base_url(self):
        return f"http://{HOST}:{self.port}"

    def launch(self):
        """Start the server process on a fresh port, without waiting for it."""
        if self.deadline is None:
            self.deadline = time.monotonic() + START_TIMEOUT
        self.attempts += 1
        self.port = free_port()
        self.proc = subprocess.Popen(
            [sys.executable, SERVER, "--port", str(self.port)],
            cwd=REPO,
            env=dict(os.environ),  # TORCH_GRADMODE_OVERLAY included
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def ready(self):
        """Return the server's ``/healthz`` answer once it gives one; raise with its output if it never does."""
        if self.health is None and self.failure is None:
            while True:
                self.health = self._wait_until_answering(self.deadline)
                if self.health is not None:
                    break
                alive = self.proc.poll() is None
                self.stop()
                if alive or self.attempts >= START_ATTEMPTS or time.monotonic() >= self.deadline:
                    self.failure = (f"the server did not answer within {START_TIMEOUT} s "
                                    f"({self.attempts} launches); its output:\n{self.output()}")
                    break
                self.launch()
        if self.failure is not None:
            raise RuntimeError(self.failure)
        return self.health

    def _wait_until_answering(self, deadline):
        """Return ``/healthz``'s answer, or None if the server died or the deadline passed."""
        with httpx.Client(base_url=self.base_url, trust_env=False, timeout=2.0) as client:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    return None  # it died, e.g. the port was taken after all
                try:
                    response = client.get("/healthz")
                except httpx.TransportError:
                    time.sleep(0.2)
                    continue
                if response.status_code == 200:
                    return response.json()
                time.sleep(0.2)
        return None

    def stop(self):
        """Terminate the server, waiting a bounded time, then kill it if it is still up."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=STOP_TIMEOUT)

    def close(self):
        self.stop()
        self.log.close()

    def output(self):
        self.log.flush()
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-4000:]


async def get_training(client):
    response = await client.get("/training")
    response.raise_for_status()
    return response.json()


async def predict(client, i):
    response = await client.post("/predict", json={"x": predict_input(i)})
    response.raise_for_status()
    return response.json()


async def stream(client, n):
    lines = []
    async with client.stream("GET", "/stream", params={"n": n}) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if line.strip():
                lines.append(json.loads(line))
    return lines


async def load(base_url, n_predict, n_stream, stream_lines):
    """Send ``n_predict`` ``/predict`` and ``n_stream`` ``/stream`` requests at once."""
    limits = httpx.Limits(max_connections=n_predict + n_stream + 2)
    async with httpx.AsyncClient(base_url=base_url, trust_env=False, timeout=REQUEST_TIMEOUT,
                                 limits=limits) as client:
        requests = [predict(client, i) for i in range(n_predict)]
        requests += [stream(client, stream_lines) for _ in range(n_stream)]
        results = await asyncio.wait_for(asyncio.gather(*requests), LOAD_TIMEOUT)
    return results[:n_predict], results[n_predict:]


@unittest.skipIf(not HAS_SERVER_DEPS, "needs fastapi, uvicorn and httpx")
class TestAsyncServer(TestCase):
    """Concurrent requests to the example server, with its trainer running alongside."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.server = ServerProcess()
        cls.addClassCleanup(cls.server.close)  # runs even if something below raises
        cls.server.launch()
        # While the server starts up, build the reference model here.
        cls.example = load_example()
        cls.model = cls.example.build_model()

    def setUp(self):
        super().setUp()
        self.health = self.server.ready()

    def where(self):
        """Say which torch the server runs, for failure messages."""
        return (f"server torch {self.health['torch']}, _contextlib from {self.health['contextlib']}, "
                f"predict is a coroutine function: {self.health['predict_is_coroutine_function']}")

    def expected_predict(self, i):
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            return torch.softmax(self.model(torch.tensor(predict_input(i))), dim=-1).float()

    def expected_stream_line(self, i):
        with torch.no_grad():
            return self.model(self.example.stream_input(i))

    def test_predict_under_concurrent_load(self):
        predicts, _ = asyncio.run(load(self.server.base_url, N_PREDICT, N_STREAM, STREAM_LINES))
        self.assertEqual(len(predicts), N_PREDICT)
        for i, result in enumerate(predicts):
            msg = f"/predict #{i}: {result}; {self.where()}"
            self.assertTrue(result["is_inference"], msg)
            self.assertTrue(result["inference_mode_at_every_step"], msg)
            self.assertEqual([s["step"] for s in result["steps"]], ["input", "linear", "softmax"], msg=msg)
            for step in result["steps"]:
                self.assertTrue(step["inference_mode"], msg)
                self.assertTrue(step["autocast"], msg)
                self.assertTrue(step["is_inference"], msg)
                self.assertFalse(step["grad_enabled"], msg)
            self.assertEqual([s["dtype"] for s in result["steps"]],
                             ["torch.float32", "torch.bfloat16", "torch.bfloat16"], msg=msg)
            self.assertEqual(torch.tensor(result["output"]), self.expected_predict(i), atol=0, rtol=0, msg=msg)

    def test_non_finite_input_is_a_client_error(self):
        async def post(body):
            async with httpx.AsyncClient(base_url=self.server.base_url, trust_env=False,
                                         timeout=REQUEST_TIMEOUT) as client:
                return await client.post("/predict", content=body, headers={"content-type": "application/json"})

        for number in ("1e400", "-1e400", "NaN", "Infinity"):
            response = asyncio.run(post(f'{{"x": [{number}, 1, 2, 3]}}'))
            self.assertEqual(response.status_code, 422, f"{number}: {response.text}")
            self.assertIn("finite number", response.text, number)

    def test_stream_under_concurrent_load(self):
        _, streams = asyncio.run(load(self.server.base_url, N_PREDICT, N_STREAM, STREAM_LINES))
        self.assertEqual(len(streams), N_STREAM)
        for k, lines in enumerate(streams):
            self.assertEqual(len(lines), STREAM_LINES, msg=f"/stream #{k} is incomplete: {lines}")
            for i, line in enumerate(lines):
                msg = f"/stream #{k} line {i}: {line}; {self.where()}"
                self.assertEqual(line["i"], i, msg=msg)
                self.assertTrue(line["is_inference"], msg)
                self.assertTrue(line["inference_mode"], msg)
                self.assertFalse(line["autocast"], msg)
                self.assertFalse(line["grad_enabled"], msg)
                self.assertEqual(torch.tensor(line["output"]), self.expected_stream_line(i), atol=1e-6, rtol=1e-5,
                                 msg=msg)

    def test_training_alongside_requests(self):
        async def scenario():
            async with httpx.AsyncClient(base_url=self.server.base_url, trust_env=False,
                                         timeout=REQUEST_TIMEOUT) as client:
                before = await get_training(client)
                await load(self.server.base_url, N_PREDICT, N_STREAM, STREAM_LINES)
                deadline = time.monotonic() + TRAINING_TIMEOUT
                after = await get_training(client)
                while after["iterations"] <= before["iterations"] and time.monotonic() < deadline:
                    await asyncio.sleep(0.1)
                    after = await get_training(client)
                return before, after

        before, after = asyncio.run(scenario())
        msg = f"/training before {before}, after {after}; {self.where()}"
        self.assertTrue(after["running"], msg)
        self.assertGreater(after["iterations"], 0, msg)
        self.assertGreater(after["iterations"], before["iterations"], msg)
        # The trainer's forward passes really were interrupted by requests in progress.
        self.assertGreater(after["overlapped_iterations"], before["overlapped_iterations"], msg)
        self.assertEqual(after["violations"], 0, msg=msg)
        self.assertEqual(after["gradient_failures"], 0, msg=msg)
        self.assertEqual(after["errors"], [], msg=msg)


if __name__ == "__main__":
    run_tests()

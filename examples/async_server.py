"""A small async model server: grad-mode decorators on FastAPI endpoints, on one event loop.

Everything here runs on one thread, in one asyncio event loop, and the tasks
interleave at every ``await``:

* ``POST /predict`` is an ``async def`` endpoint decorated with
  ``@torch.autocast("cpu", dtype=torch.bfloat16)`` and
  ``@torch.inference_mode()``.  It awaits between its computing steps, and
  reports, for every step, whether inference mode and autocast were enabled,
  whether the tensor it computed is an inference tensor, and its dtype.  A
  request whose numbers are not four finite floats gets 422 with the reason.
* ``GET /stream?n=N`` is a ``StreamingResponse`` backed by an
  ``@torch.inference_mode()`` async generator that yields ``N`` JSON lines,
  each computed after an ``await``.
* A background task, started by the app's lifespan, trains a separate model
  with autograd.  Each iteration's forward pass runs in a
  ``with torch.enable_grad():`` block that spans an ``await``, so the other
  tasks run in the middle of it.  The task records any point at which grad
  mode was off, inference mode or autocast on, and checks each gradient
  against its analytic value.  ``GET /training`` reports the counts.

Grad mode and inference mode are thread-local state, not frame state.  With
this patch the decorators switch the mode in for each step of the decorated
body and give the event loop its own mode back after it, so the endpoints
compute inference tensors at every step and the trainer never sees their
mode.  On stock torch 2.13.0 the decorators act only on the call that creates
the coroutine or async generator, not on its body, so both endpoints compute
ordinary tensors with inference mode off.  (Stock ``predict`` is not a
coroutine function either; FastAPI still awaits it because it follows
``__wrapped__`` to the ``async def``.)  See
``docs/source/notes/grad_mode_suspend.md``.

Run it (it listens on 127.0.0.1 only)::

    python examples/async_server.py --port 8000
    curl -s -X POST localhost:8000/predict -H 'content-type: application/json' -d '{"x": [1, 2, 3, 4]}'
    curl -s 'localhost:8000/stream?n=3'
    curl -s localhost:8000/training

``project_tests/test_async_server.py`` starts it as a subprocess and load-tests it.
"""

import argparse
import asyncio
import contextlib
import inspect
import json
import os
from typing import Annotated

import torch
import torch.utils._contextlib
from fastapi import FastAPI, Query
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, Field

HOST = "127.0.0.1"
IN_FEATURES = 4
OUT_FEATURES = 2
MODEL_SEED = 0
MAX_STREAM_LINES = 1000


def build_model():
    """Return the served model: ``torch.nn.Linear(4, 2)`` initialised from a fixed seed.

    A fresh ``torch.Generator`` makes the weights the same in every process
    without touching the global RNG, so a client can rebuild the model to
    check the served values.
    """
    generator = torch.Generator().manual_seed(MODEL_SEED)
    model = torch.nn.Linear(IN_FEATURES, OUT_FEATURES)
    with torch.no_grad():
        bound = 1.0 / IN_FEATURES ** 0.5
        model.weight.copy_(torch.rand(model.weight.shape, generator=generator) * 2 * bound - bound)
        model.bias.copy_(torch.rand(model.bias.shape, generator=generator) * 2 * bound - bound)
    model.eval()
    return model


def stream_input(i):
    """Return the input the stream feeds the model for line ``i``."""
    return torch.arange(IN_FEATURES, dtype=torch.float32) + float(i)


def mode_state():
    """Return the calling thread's grad mode, inference mode and CPU autocast flag, as a dict."""
    return {
        "grad_enabled": torch.is_grad_enabled(),
        "inference_mode": torch.is_inference_mode_enabled(),
        "autocast": torch.is_autocast_enabled("cpu"),
    }


MODEL = build_model()

# How many endpoint bodies are between their first and last step right now.
# The trainer reads it to count the iterations whose forward pass was
# interrupted by a request in progress.
IN_FLIGHT = 0


@contextlib.contextmanager
def in_flight():
    """Count the enclosed endpoint body in ``IN_FLIGHT`` while it runs, awaits included."""
    global IN_FLIGHT
    IN_FLIGHT += 1
    try:
        yield
    finally:
        IN_FLIGHT -= 1


class PredictRequest(BaseModel):
    """The body of ``POST /predict``: one input vector of four finite numbers.

    Non-finite ones (``1e400`` parses as infinity, ``NaN``) are refused with 422:
    accepted, they made outputs the reply cannot encode (500).
    """

    x: list[Annotated[float, Field(allow_inf_nan=False)]] = Field(min_length=IN_FEATURES, max_length=IN_FEATURES)


# ---------------------------------------------------------------------------
# The background trainer
# ---------------------------------------------------------------------------


class Trainer:
    """Trains ``w`` in ``loss = (w * x).sum()`` by SGD, with an ``await`` inside every forward pass.

    The gradient of that loss with respect to ``w`` is ``x``, so every
    backward pass can be checked exactly.  At every point of an iteration the
    trainer checks that grad mode is on and inference mode is off -- what its
    own code set -- and counts each point where it is not as a violation.
    """

    def __init__(self, pause=0.001, lr=0.01):
        """Make a trainer that sleeps ``pause`` seconds between iterations and steps by ``lr``."""
        generator = torch.Generator().manual_seed(MODEL_SEED + 1)
        self.w = torch.randn(IN_FEATURES, generator=generator, requires_grad=True)
        self.x = torch.tensor([1.0, -2.0, 0.5, 3.0])
        self.pause = pause
        self.lr = lr
        self.iterations = 0
        self.overlapped_iterations = 0
        self.checks = 0
        self.violations = 0
        self.gradient_failures = 0
        self.errors = []
        self.running = False

    def _check_mode(self, where, problems):
        self.checks += 1
        if not torch.is_grad_enabled() or torch.is_inference_mode_enabled() or torch.is_autocast_enabled("cpu"):
            self.violations += 1
            problems.append(f"{where}: {mode_state()}")

    async def iteration(self):
        """Run one forward/backward/update iteration; return a list of problems seen."""
        problems = []
        self.w.grad = None
        self._check_mode("start", problems)
        with torch.enable_grad():
            self._check_mode("enable_grad entered", problems)
            y = self.w * self.x
            self._check_mode("after multiply", problems)
            # The endpoints run here, in the middle of the forward pass.  The
            # raw ``with`` across an await is deliberate (the TGM lint flags it):
            # this task's mode is on the thread while it is suspended, and the
            # decorated endpoints must still see only theirs.
            await asyncio.sleep(0)  # noqa: TGM002
            self._check_mode("after await", problems)
            if IN_FLIGHT:
                self.overlapped_iterations += 1
            loss = y.sum()
            self._check_mode("after sum", problems)
        self._check_mode("enable_grad exited", problems)
        try:
            loss.backward()
        except RuntimeError as e:  # e.g. the forward ran in inference mode and has no graph
            self.gradient_failures += 1
            problems.append(f"backward failed: {e}")
        else:
            self._check_mode("after backward", problems)
            if self.w.grad is None or not torch.equal(self.w.grad, self.x):
                self.gradient_failures += 1
                problems.append(f"gradient {self.w.grad} != {self.x}")
            else:
                with torch.no_grad():
                    self.w -= self.lr * self.w.grad
        self.iterations += 1
        return problems

    async def run(self):
        """Train until cancelled, yielding to the event loop between iterations."""
        self.running = True
        try:
            while True:
                problems = await self.iteration()
                if problems and len(self.errors) < 20:
                    self.errors.extend(problems[:20 - len(self.errors)])
                await asyncio.sleep(self.pause)
        finally:
            self.running = False

    def report(self):
        """Return the counters ``GET /training`` serves."""
        return {
            "running": self.running,
            "iterations": self.iterations,
            "overlapped_iterations": self.overlapped_iterations,
            "checks": self.checks,
            "violations": self.violations,
            "gradient_failures": self.gradient_failures,
            "errors": list(self.errors),
        }


TRAINER = Trainer()


@contextlib.asynccontextmanager
async def lifespan(app):
    """Run the trainer as a task on the server's event loop for as long as the app is up."""
    task = asyncio.get_running_loop().create_task(TRAINER.run(), name="trainer")
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


app = FastAPI(title="grad-mode async server example", lifespan=lifespan)


@app.exception_handler(RequestValidationError)
async def invalid_request(request, exc):
    """Answer 422 with where and why each input is wrong, without echoing it.

    FastAPI's own answer echoes the input, and a non-finite number (which a
    JSON body can carry as ``1e400`` or ``NaN``) cannot be encoded back: 500.
    """
    errors = [{"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]} for e in exc.errors()]
    return JSONResponse(status_code=422, content={"detail": errors})


# ---------------------------------------------------------------------------
# The endpoints
# ---------------------------------------------------------------------------


@app.post("/predict")
@torch.autocast("cpu", dtype=torch.bfloat16)
@torch.inference_mode()
async def predict(request: PredictRequest):
    """Run the model on ``request.x`` in inference mode and bfloat16 autocast, awaiting between the steps.

    Returns the output values (the softmax of the linear layer's output) and,
    for each step, the modes in force, whether the tensor computed in it is an
    inference tensor, and its dtype.
    """
    steps = []
    with in_flight():
        x = torch.tensor(request.x, dtype=torch.float32)
        steps.append({"step": "input", "is_inference": x.is_inference(), "dtype": str(x.dtype), **mode_state()})
        await asyncio.sleep(0)
        hidden = MODEL(x)
        steps.append({"step": "linear", "is_inference": hidden.is_inference(), "dtype": str(hidden.dtype),
                      **mode_state()})
        await asyncio.sleep(0)
        output = torch.softmax(hidden, dim=-1)
        steps.append({"step": "softmax", "is_inference": output.is_inference(), "dtype": str(output.dtype),
                      **mode_state()})
    return {
        "output": output.float().tolist(),
        "is_inference": output.is_inference(),
        "inference_mode_at_every_step": all(s["inference_mode"] for s in steps),
        "steps": steps,
    }


@torch.inference_mode()
async def stream_lines(n):
    """Yield ``n`` JSON lines, each computed in inference mode after an ``await``."""
    with in_flight():
        for i in range(n):
            await asyncio.sleep(0)
            output = MODEL(stream_input(i))
            line = {"i": i, "output": output.tolist(), "is_inference": output.is_inference(), **mode_state()}
            yield json.dumps(line) + "\n"


@app.get("/stream")
async def stream(n: int = Query(10, ge=1, le=MAX_STREAM_LINES)):
    """Stream ``n`` JSON lines from the ``@torch.inference_mode()`` async generator ``stream_lines``."""
    return StreamingResponse(stream_lines(n), media_type="application/x-ndjson")


@app.get("/training")
async def training():
    """Report the background trainer's counts: iterations (and those that overlapped a request),
    mode violations and gradient-check failures, with the first problems seen."""
    return TRAINER.report()


@app.get("/healthz")
async def healthz():
    """Say the server is up, and which torch and ``_contextlib`` it runs."""
    return {
        "ok": True,
        "torch": torch.__version__,
        "contextlib": os.path.realpath(torch.utils._contextlib.__file__),
        "predict_is_coroutine_function": inspect.iscoroutinefunction(predict),
        "stream_lines_is_async_generator_function": inspect.isasyncgenfunction(stream_lines),
        **mode_state(),
    }


def main(argv=None):
    """Parse ``--port`` and serve the app with uvicorn on 127.0.0.1 until interrupted."""
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8000, help="TCP port on 127.0.0.1 (default 8000)")
    parser.add_argument("--log-level", default="warning", help="uvicorn log level (default warning)")
    args = parser.parse_args(argv)
    # The pure-Python event loop and HTTP parser: one thread, no optional extras.
    uvicorn.run(app, host=HOST, port=args.port, loop="asyncio", http="h11", lifespan="on",
                log_level=args.log_level)


if __name__ == "__main__":
    main()

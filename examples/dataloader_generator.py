"""A DataLoader over an IterableDataset whose ``__iter__`` is a ``@torch.no_grad()`` generator.

Two worker processes, started with the ``spawn`` method, so each is a fresh
interpreter: the report shows which ``torch/utils/_contextlib.py`` each one
loaded, i.e. that the patch reaches spawned workers.  In each worker the
generator body

* starts with grad off (the decorator's mode), and
* computes a derivative with autograd inside its own
  ``with torch.enable_grad():`` block that stays open across its ``yield``\\ s,
  which needs grad to stay on after every resume.

With torch 2.13.0 (``TORCH_GRADMODE_OVERLAY=0``, which the workers inherit) the
decorator switches grad off again at every resume, inside the body's block.

Run: ``python examples/dataloader_generator.py`` (``--json`` also prints the report as JSON).
"""

import json
import os
import sys

import torch
import torch.utils._contextlib
from torch.utils.data import DataLoader, get_worker_info, IterableDataset

ITEMS_PER_WORKER = 4
NUM_WORKERS = 2


class Cubes(IterableDataset):
    """Yields, per worker, the derivative of x**3 at x = 0, 1, 2, ... computed with autograd."""

    @torch.no_grad()
    def __iter__(self):
        info = get_worker_info()
        worker = info.id if info is not None else -1
        source = os.path.realpath(torch.utils._contextlib.__file__)
        grad_at_start = torch.is_grad_enabled()
        with torch.enable_grad():
            for i in range(ITEMS_PER_WORKER):
                x = torch.tensor(float(worker * ITEMS_PER_WORKER + i), requires_grad=True)
                grad_on = torch.is_grad_enabled()
                y = x**3
                if y.requires_grad:
                    (dy,) = torch.autograd.grad(y, x)
                    derivative = float(dy)
                else:
                    derivative = None
                yield {
                    "worker": worker,
                    "pid": os.getpid(),
                    "contextlib": source,
                    "x": float(x.detach()),
                    "grad_at_start": grad_at_start,
                    "grad_in_block": grad_on,
                    "derivative": derivative,
                }
        yield {"worker": worker, "pid": os.getpid(), "grad_after_block": torch.is_grad_enabled()}


def main():
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    # The install builds the patched module into a tree under the checkout's build/.
    checkout_build = os.path.realpath(os.path.join(repo, "build")) + os.sep
    loader = DataLoader(Cubes(), batch_size=None, num_workers=NUM_WORKERS, multiprocessing_context="spawn")
    items = list(loader)
    steps = [it for it in items if "x" in it]
    ends = [it for it in items if "grad_after_block" in it]
    report = {
        "main_pid": os.getpid(),
        "main_contextlib": os.path.realpath(torch.utils._contextlib.__file__),
        "checkout_build": checkout_build,
        "worker_pids": sorted({it["pid"] for it in items}),
        "worker_contextlib": sorted({it["contextlib"] for it in steps}),
        "items": len(steps),
        "grad_at_start": sorted({it["grad_at_start"] for it in steps}),
        "grad_in_enable_grad_block": [it["grad_in_block"] for it in sorted(steps, key=lambda it: it["x"])],
        "derivatives": [it["derivative"] for it in sorted(steps, key=lambda it: it["x"])],
        "grad_after_block": sorted({it["grad_after_block"] for it in ends}),
        "caller_grad_enabled_after": torch.is_grad_enabled(),
    }
    xs = sorted(it["x"] for it in steps)
    report["ok"] = (
        report["items"] == NUM_WORKERS * ITEMS_PER_WORKER
        and len(report["worker_pids"]) == NUM_WORKERS
        and report["main_pid"] not in report["worker_pids"]
        and report["worker_contextlib"] == [report["main_contextlib"]]
        and report["main_contextlib"].startswith(checkout_build)
        and report["grad_at_start"] == [False]
        and all(report["grad_in_enable_grad_block"])
        and report["derivatives"] == [3 * x * x for x in xs]
        and report["grad_after_block"] == [False]
        and report["caller_grad_enabled_after"]
    )
    return report


if __name__ == "__main__":
    result = main()
    print(f"main process {result['main_pid']}: torch/utils/_contextlib.py from {result['main_contextlib']}")
    print(f"workers {result['worker_pids']} (spawn): torch/utils/_contextlib.py from {result['worker_contextlib']}")
    print(f"{result['items']} items; generator body: grad at start {result['grad_at_start']}, "
          f"inside its enable_grad block (per item) {result['grad_in_enable_grad_block']}, "
          f"after the block {result['grad_after_block']}")
    print(f"d(x**3)/dx computed in the workers: {result['derivatives']}")
    print("OK" if result["ok"] else "FAILED")
    if "--json" in sys.argv[1:]:
        print(json.dumps(result))
    sys.exit(0 if result["ok"] else 1)

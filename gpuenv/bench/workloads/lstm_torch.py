"""The seed's IMDB LSTM in PyTorch, on synthetic data: 25000 reviews of 80 tokens over a
20000-word vocabulary, Embedding(128) -> LSTM(128) -> dropout 0.2 -> Linear(1), batch 32,
Adam, binary cross-entropy with logits. One epoch (scaled by --scale).

Three rows, as the seed's table: --device cpu; --device gpu with cuDNN turned off (PyTorch's
own CUDA LSTM, one fused cell kernel per time step: the seed's non-cuDNN "GPU" row);
--device gpu --cudnn 1 (cuDNN's fused LSTM). Which kernel ran is read, not assumed: the op
PyTorch dispatched (aten::_cudnn_rnn for cuDNN) is in the result, and a --cudnn run that did
not reach cuDNN fails. Standard library + torch: runs in a host environment with PyTorch
(scripts/gpu-proof.sh) and needs no gpuenv.
"""

from __future__ import annotations

import itertools
import math
import os
import platform
import statistics
import time

from _harness import _quantile, cpu_name, emit, fail, parse_args

SAMPLES, MAXLEN, VOCAB, BATCH = 25000, 80, 20000, 32
RNN_OPS = ("aten::_cudnn_rnn", "aten::_thnn_fused_lstm_cell", "aten::lstm")


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], cudnn=0)
    if args.cudnn and args.device != "gpu":
        fail("the cuDNN LSTM kernel needs a GPU")
    import torch

    if args.device == "gpu":
        if not torch.cuda.is_available():
            fail("PyTorch sees no GPU here (a GPU row is never measured on the CPU)")
        device = torch.device("cuda", 0)
        props = torch.cuda.get_device_properties(0)
        what = f"GPU: {props.name} (cc {props.major}.{props.minor})"
        torch.backends.cudnn.enabled = bool(args.cudnn)
    else:
        device = torch.device("cpu")
        what = f"CPU: {cpu_name()}, {torch.get_num_threads()} threads"
    torch.manual_seed(args.seed)

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embedding = torch.nn.Embedding(VOCAB, 128)
            self.lstm = torch.nn.LSTM(128, 128, batch_first=True)
            self.dropout = torch.nn.Dropout(0.2)
            self.out = torch.nn.Linear(128, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            _, (h, _) = self.lstm(self.embedding(x))
            return self.out(self.dropout(h[-1]))

    n = max(round(SAMPLES * args.scale), (args.warmup + 5) * BATCH)
    generator = torch.Generator().manual_seed(args.seed)
    x = torch.randint(1, VOCAB, (n, MAXLEN), generator=generator).to(device)
    y = torch.randint(0, 2, (n, 1), generator=generator).float().to(device)
    model = Model().to(device)
    optimiser = torch.optim.Adam(model.parameters())
    loss_fn = torch.nn.BCEWithLogitsLoss()

    def step(i: int) -> float:
        xb, yb = x[i : i + BATCH], y[i : i + BATCH]
        optimiser.zero_grad(set_to_none=True)
        loss = loss_fn(model(xb), yb)
        loss.backward()
        optimiser.step()
        return float(loss.item())  # waits for the step, as Keras' progress bar does

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        step(0)
    ops = {e.key for e in prof.key_averages()}
    kernel = next((op for op in RNN_OPS if op in ops), "unknown")
    if args.cudnn and kernel != "aten::_cudnn_rnn":
        fail(f"cuDNN was asked for, PyTorch ran {kernel} (cuDNN {torch.backends.cudnn.version()})")

    marks = [time.perf_counter()]
    for i in range(BATCH, n - BATCH + 1, BATCH):
        step(i)
        marks.append(time.perf_counter())
    step_ms = [(b - a) * 1000 for a, b in itertools.pairwise(marks)]
    measured = step_ms[args.warmup :]
    if len(measured) < 3:
        fail(f"only {len(measured)} steps after {args.warmup} warm-up steps: raise --scale")
    median = statistics.median(measured)
    full_steps = math.ceil(SAMPLES / BATCH)
    emit(
        {
            "workload": "lstm-cudnn" if args.cudnn else "lstm",
            "device_kind": args.device,
            "device": what,
            "framework": f"torch {torch.__version__}",
            "cudnn": torch.backends.cudnn.version() if args.device == "gpu" else None,
            "kernel": kernel,
            "python": platform.python_version(),
            "ms_per_step": round(median, 3),
            "ms_per_step_p10": round(_quantile(measured, 0.1), 3),
            "ms_per_step_p90": round(_quantile(measured, 0.9), 3),
            "steps": len(step_ms) + 1,
            "warmup_steps": args.warmup,
            "measured_steps": len(measured),
            "measured_s": round(sum(step_ms) / 1000, 3),
            "full_epoch_steps": full_steps,
            "epoch_s": round(median * full_steps / 1000, 2),
            "samples": n,
            "batch": BATCH,
            "threads": os.cpu_count(),
        }
    )


if __name__ == "__main__":
    main()

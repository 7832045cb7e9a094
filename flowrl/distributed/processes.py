"""accelerate wiring: the one module that knows about processes, devices, mixed precision and backends.

Data parallelism in the RL loop (Flow-GRPO's ``DistributedKRepeatSampler``, ``train_sd3.py``): every process
computes the same global list of N = prompts × group_size samples for an iteration (a pure function of the
iteration), rolls out and scores its contiguous slice ``local_slice(N)``, and the rewards are gathered so that
advantages are computed over the whole batch on every process — a group may span processes. Gradients of the
trainable parameters are averaged across processes before each optimizer step (``average_gradients``), which
works whichever weights (LoRA adapter or full transformer) the policy calls. A sharded run (``sharded``:
``dist.fsdp`` or accelerate's FSDP config, more than one process) shards the transformers with FSDP2
(``flowrl.distributed.fsdp``), whose backward already averages the gradients. DeepSpeed is refused: its engine
would have to own the model and optimizer, which the loop keeps (docs/training.md "Multi-GPU and multi-node").
"""
from __future__ import annotations

import os
from contextlib import nullcontext

import torch
from torch import Tensor, nn

from flowrl.errors import LaunchError


def make_accelerator(mixed_precision: str = "no", cpu: bool = False):
    """An ``accelerate.Accelerator`` (reads ``accelerate launch`` / ``torchrun`` settings from the environment).

    Refuses (``LaunchError``) a multi-process launch whose processes would not join one process group — each
    would run the whole job into the same run directory: torchrun/accelerate starting N > 1 processes on a
    machine without a GPU and without ``run.cpu=true`` (accelerate then builds N independent single-process
    runs), or any launch where the accelerator sees a different number of processes than were started."""
    from accelerate import Accelerator

    launched = launched_processes()
    if launched > 1 and not cpu and not accelerator_available():
        raise LaunchError(f"{launched} processes were launched (WORLD_SIZE={launched}) but no GPU is visible and "
                          "run.cpu is false: each process would train the whole run alone into the same "
                          "directory. Set run.cpu=true to train on CPU processes (gloo), or make the GPUs "
                          "visible (drivers, CUDA_VISIBLE_DEVICES)")
    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true":
        raise LaunchError("accelerate launched with a DeepSpeed config: flowrl does not run DeepSpeed (its engine "
                          "would own the model and optimizer the loop keeps); shard with FSDP instead: "
                          "dist.fsdp=true or --config_file configs/accelerate/fsdp.yaml")
    join_restarted_group(cpu)
    acc = Accelerator(mixed_precision=mixed_precision, cpu=cpu)
    if launched > 1 and acc.num_processes != launched:
        raise LaunchError(f"{launched} processes were launched (WORLD_SIZE={launched}) but accelerate joined "
                          f"{acc.num_processes} (distributed type {acc.distributed_type.name}); each would run "
                          "the whole job alone. Launch with accelerate launch / torchrun on devices accelerate "
                          "can use, or set run.cpu=true")
    return acc


def join_restarted_group(cpu: bool) -> bool:
    """A worker group torchrun restarted (``--max-restarts``, TORCHELASTIC_RESTART_COUNT >= 1) joins its process
    group on the agent's store under a prefix of its own try, ``/worker/attempt_<n>`` (accelerate then uses that
    group). torch 2.14 dropped that prefix (rendezvous.py: "a new TCPStore for every retry"), but the agent keeps
    one store across tries, so a restarted rank could read the dead group's gloo addresses and hang or fail with
    "Connection refused" (a two-line gloo worker, one rank killed after the group met: its restart failed 3 of 3
    times on the static rendezvous and 3 of 4 on c10d; with the prefix it met 2 of 2). The first try, single
    processes and other devices keep accelerate's own init. True when it joined here."""
    dist = torch.distributed
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    if restart < 1 or launched_processes() < 2 or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" \
            or not dist.is_available() or dist.is_initialized():
        return False
    gpu = not cpu and torch.cuda.is_available()
    if not cpu and not gpu:
        return False                                # another accelerator: accelerate picks its backend
    if gpu:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    from torch.distributed.constants import default_pg_timeout

    world = launched_processes()
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, is_master=False,
                          timeout=default_pg_timeout)
    dist.init_process_group("nccl" if gpu else "gloo", store=dist.PrefixStore(f"/worker/attempt_{restart}", store),
                            rank=int(os.environ["RANK"]), world_size=world)
    return True


def launched_processes() -> int:
    """How many processes the launcher started (``WORLD_SIZE``, set by torchrun and accelerate launch)."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        raise LaunchError(f"WORLD_SIZE={os.environ['WORLD_SIZE']!r} is not a number") from None


def accelerator_available() -> bool:
    """A device accelerate would put a process group on: CUDA (or ROCm), or an Intel XPU."""
    xpu = getattr(torch, "xpu", None)
    return torch.cuda.is_available() or bool(xpu is not None and xpu.is_available())


class Dist:
    """Process geometry and collectives, with a plain single-process fallback when ``accelerator`` is None."""

    def __init__(self, accelerator=None, fsdp: bool = False):
        from flowrl.distributed.fsdp import accelerate_fsdp

        self.accelerator = accelerator
        self.rank = accelerator.process_index if accelerator else 0
        self.world = accelerator.num_processes if accelerator else 1
        self.device = accelerator.device if accelerator else torch.device("cpu")
        wanted = fsdp or accelerate_fsdp(accelerator)
        self.sharded = wanted and self.world > 1      # the policy's transformers are FSDP-sharded (parts.py)
        self.sharding = None                          # flowrl.distributed.fsdp.Sharding, once they are
        if wanted and not self.sharded:
            print("[flowrl] dist.fsdp: one process, nothing to shard; training unsharded", flush=True)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def local_slice(self, n: int) -> slice:
        """This process's contiguous share of ``n`` global samples (n must divide by the world size)."""
        if n % self.world:
            raise ValueError(f"{n} samples do not split over {self.world} processes")
        k = n // self.world
        return slice(self.rank * k, (self.rank + 1) * k)

    def gather(self, t: Tensor) -> Tensor:
        """Concatenate a per-process tensor (dim 0) across processes, in rank order."""
        if self.world == 1:
            return t
        return self.accelerator.gather(t.to(self.device).contiguous()).to(t.device)

    def gather_objects(self, items: list) -> list:
        """Concatenate per-process lists of picklable objects (prompt metadata), in rank order."""
        if self.world == 1:
            return list(items)
        from accelerate.utils import gather_object

        return list(gather_object(list(items)))

    def mean(self, t: Tensor) -> Tensor:
        """Average a tensor across processes (for logged metrics)."""
        if self.world == 1:
            return t
        return self.accelerator.reduce(t.to(self.device).clone(), reduction="mean").to(t.device)

    def sum(self, t: Tensor) -> Tensor:
        if self.world == 1:
            return t
        return self.accelerator.reduce(t.to(self.device).clone(), reduction="sum").to(t.device)

    def average_gradients(self, params: list[nn.Parameter]) -> None:
        """p.grad ← mean over processes (data-parallel SGD). No-op for one process, and when sharded: FSDP's
        backward reduce-scatters the mean already."""
        if self.world == 1 or self.sharded:
            return
        for p in params:
            if p.grad is not None:
                p.grad.copy_(self.accelerator.reduce(p.grad, reduction="mean"))

    def backward(self, loss: Tensor) -> None:
        """``loss.backward()`` through accelerate when present (gradient scaling under fp16)."""
        if self.accelerator is not None:
            self.accelerator.backward(loss)
        else:
            loss.backward()

    @property
    def scaler(self):
        """accelerate's fp16 GradScaler (None in fp32 / bf16): ``backward`` scales the loss with it."""
        return getattr(self.accelerator, "scaler", None) if self.accelerator is not None else None

    def unscale_gradients(self, optimizer) -> None:
        """Divide the gradients by the fp16 loss scale before clipping (no-op without a scaler)."""
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)

    def optimizer_step(self, optimizer) -> None:
        """``optimizer.step()``, through the fp16 scaler when there is one (which also updates the scale)."""
        if self.scaler is None:
            optimizer.step()
            return
        self.scaler.step(optimizer)
        self.scaler.update()

    def autocast(self):
        """Mixed-precision context for model forwards (no-op in fp32)."""
        return self.accelerator.autocast() if self.accelerator else nullcontext()

    def barrier(self) -> None:
        if self.world > 1:
            self.accelerator.wait_for_everyone()

    def print(self, *args) -> None:
        if self.is_main:
            print(*args, flush=True)

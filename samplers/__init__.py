"""Denoising samplers: pure tensor math and rollout engines. Knows a velocity function, not a model.

Imports only torch and flowrl.types (plus flowrl.registry here). Kernels and windows are reached by name:

    >>> from samplers import KERNELS, WINDOWS
    >>> k = KERNELS.get("flow_sde"); out = k.step(x, v, sigma, sigma_next, noise, cfg=k.config(noise_level=0.9))
    >>> plan = WINDOWS.get("sliding")().plan(iteration, num_steps)
    >>> branch = BRANCHINGS.get("fixed")(steps=(0, 2, 4)).plan(iteration, num_steps)   # a tree's splits

See docs/samplers.md for the equations, the log-prob normalisation choice and how to add a kernel.
"""
from flowrl.registry import Registry

KERNELS = Registry("sampler kernel", {
    "ode": "samplers.ode:KERNEL",
    "flow_sde": "samplers.flow_sde:KERNEL",
    "dance_sde": "samplers.dance_sde:KERNEL",
    "cps": "samplers.cps:KERNEL",
    "dpmpp_2m": "samplers.dpm_solver:KERNEL",
})

WINDOWS = Registry("step window", {
    "all": "samplers.windows:AllSteps",
    "fixed": "samplers.windows:FixedSteps",
    "random": "samplers.windows:RandomWindow",
    "sliding": "samplers.windows:SlidingWindow",
    "merged": "samplers.windows:MergedStep",
})

BRANCHINGS = Registry("tree branching", {
    "none": "samplers.tree_spec:NoSplit",
    "fixed": "samplers.tree_spec:FixedSplits",
    "window": "samplers.tree_spec:SplitWindow",
    "random_window": "samplers.tree_spec:RandomSplitWindow",
    "every_step": "samplers.tree_spec:EveryStep",
})

__all__ = ["BRANCHINGS", "KERNELS", "WINDOWS"]

"""What a reader follows through one flat GRPO iteration on the toy: the library functions ``Trainer.iteration``
runs, found by profiling the second iteration (the first pays lazy imports and set-up), counted per file as the
source lines of the functions called. docs/architecture.md "Following one iteration" quotes these figures.

Run ``python -m pytest tests/test_iteration_path.py -s`` to print the table."""
import inspect
import sys
from collections import defaultdict
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MACHINERY = ("flowrl/training/", "flowrl/objectives/", "flowrl/balancers/", "samplers/")
"""The RL loop itself: stages, sampling engine and kernels, objective, advantages (not the model, the reward,
the prompt world or the process plumbing, which a GRPO reader takes as given)."""


def iteration_functions(overrides: list[str]) -> dict[str, list[str]]:
    """{repo-relative file: [function names]} of the library functions iteration 1 calls."""
    from flowrl.config import load_config
    from flowrl.training.trainer import Trainer

    trainer = Trainer(load_config(REPO / "configs/toy/grpo.yaml", overrides))
    trainer.iteration(0)
    seen, where = {}, {}

    def library_file(filename: str) -> str | None:
        """The repo-relative path of a library file, None elsewhere (cached: this runs on every call)."""
        if filename not in where:
            try:
                rel = Path(filename).resolve().relative_to(REPO).as_posix()
            except ValueError:
                rel = None
            where[filename] = rel if rel and rel.startswith(("flowrl/", "samplers/", "rewards/")) else None
        return where[filename]

    def profile(frame, event, arg):
        if event != "call" or frame.f_code.co_name.startswith("<"):
            return
        rel = library_file(frame.f_code.co_filename)
        if rel is not None:
            seen[(rel, frame.f_code.co_firstlineno)] = frame.f_code

    sys.setprofile(profile)
    try:
        trainer.iteration(1)
    finally:
        sys.setprofile(None)
    out = defaultdict(list)
    for (rel, _), code in sorted(seen.items()):
        out[rel].append(code)
    return dict(out)


def source_lines(codes) -> int:
    return sum(len(inspect.getsourcelines(c)[0]) for c in codes)


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    out = tmp_path_factory.mktemp("path")
    return iteration_functions(["policy.tiny=true", "train.prompts_per_iter=2", "train.group_size=2",
                                "train.micro_batch=2", "sampler.chunk=2", "sampler.steps=3",
                                f"run.output_dir={out}", "log.progress=false"])


def test_a_flat_iteration_never_enters_the_tree_engine(path):
    trees = [f for f in path if f.startswith(("samplers/tree", "flowrl/training/trees", "flowrl/pools/"))]
    assert not trees, f"a flat rollout ran branching code: {trees}"
    assert "samplers/engine.py" in path and "samplers/rollout.py" in path


def test_the_rl_machinery_of_one_iteration_reads_in_under_1500_lines(path):
    machinery = {f: c for f, c in path.items() if f.startswith(MACHINERY)}
    lines = {f: source_lines(c) for f, c in machinery.items()}
    every = {f: source_lines(c) for f, c in path.items()}
    print(f"\nRL machinery: {len(lines)} files, {sum(lines.values())} lines; whole library: {len(every)} files, "
          f"{sum(every.values())} lines")
    for f, n in sorted(every.items()):
        print(f"  {n:4d}  {f}{'' if f in lines else '   (outside the machinery)'}")
    assert sum(lines.values()) <= 1500

"""Candidate pools (``sampler.pool``): a rollout strategy that scouts N candidate seeds per prompt cheaply,
keeps K and regenerates them with the full policy (``stage.py``), and the scouts it picks from (``scouts.py``,
registry ``SCOUTS``). A plugin family of its own, so the training loop names no scout."""

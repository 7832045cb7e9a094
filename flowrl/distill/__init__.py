"""Streaming-video DMD distillation: causal Wan student with a KV cache, self-forcing rollouts, DMD + critic,
Stream-R1 and RMD variants, streaming inference (docs/distill.md)."""

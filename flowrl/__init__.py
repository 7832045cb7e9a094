"""flowrl: RL alignment of flow-matching image/video generators, and streaming-video distillation.

Importing flowrl is cheap: models, rewards and samplers load lazily through the registries.
"""
__version__ = "0.1.0"

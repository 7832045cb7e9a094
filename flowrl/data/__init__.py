"""Prompt sets and the built-in shapes world."""

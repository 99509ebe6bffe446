"""The error every policy loader raises when a spec cannot be turned into a policy.

A module of its own: the loaders that live beside the registry (upstreams.py, vllm_lora.py) raise it, and the
registry (policies.py), which calls them, re-raises it; with the class in policies.py they would import each other.
"""

from __future__ import annotations


class PolicyLoadError(RuntimeError):
    """A spec could not be turned into a policy (unknown prefix, missing checkpoint, bad config)."""
